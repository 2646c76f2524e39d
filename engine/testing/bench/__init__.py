"""`ninfer-bench` (engine/testing/bench/): speed at the real Qwen3.6-27B and 35B-A3B geometries, with random weights built on the GPU.

    ninfer-bench --synthetic qwen3.6-27b [--weights-id PROFILE] [--gpu-memory-limit GiB]
                 [--kv-dtype bf16|int8] [--prompt-len 7680,65536]
                 [--concurrency 1,2,4,8] [--decode-tokens 64] [--decode-context 1024] [--json OUT]
                 [--vs-hf [--hf-max-prompt-len 16384] [--hf-concurrency 1,8]]
    ninfer-bench --synthetic qwen3.6-27b --server [--concurrency 1,8] [--server-prompt-len 1024]
                 [--server-max-tokens 256] [--server-args "..."] [--json OUT]

What one run measures, in order, on one CUDA device:
1. the device's limits, in the same run: read bandwidth (a 4 GiB fp32 ``sum``, best of 10) and the bf16
   matmul rate (8192^3 ``torch.matmul``, median of 20);
2. prefill tok/s per prompt length: one sequence through ``ModelRunner.execute`` (the engine's own step,
   chunked by ``--prefill-chunk``), after one untimed warm-up run at that length; the median of
   ``--prefill-runs`` runs; fraction of limit = tok/s / (matmul rate / FLOPs per token), FLOPs per token
   counting the linears each token really runs (active experts only) plus causal attention;
3. aggregate decode tok/s per concurrency C: C sequences with ``--decode-context`` tokens already cached
   decode ``--decode-tokens`` steps through ``ModelRunner.execute`` (CUDA graphs unless
   ``--no-cuda-graph``; greedy; each sampled token fed back), after ``--decode-warmup`` untimed steps;
   fraction of limit = tok/s / (C * read bandwidth / bytes one step must read), the bytes being every
   weight a step touches (the experts the routing can reach, in expectation), the KV read and the GDN
   state read and written.
4. ``--vs-hf``: after ours (our model and runners freed first), HF transformers' own ``Qwen3_5ForCausalLM`` /
   ``Qwen3_5MoeForCausalLM`` of the same geometry, random bf16 weights drawn on the device, timed the same
   way (synchronize + wall clock, one untimed warm-up run per length, median of ``--prefill-runs``; decode
   after ``--decode-warmup`` untimed steps): prefill is one forward of the whole prompt (HF does not chunk;
   lengths above ``--hf-max-prompt-len`` are recorded as skipped), decode is C sequences (``--hf-concurrency``,
   default ``--concurrency``) with ``--decode-context`` tokens prefilled into HF's own ``DynamicCache``, then
   one ``model(next_ids, cache)`` forward per step, greedy argmax fed back and copied to the host (no
   ``generate``). HF runs eagerly with its defaults (sdpa attention, grouped_mm experts, fla's GDN kernels
   when fla is importable); ``result["hf"]`` says which, and each row's ``speedup`` is ours / HF.
``--profile`` adds a kernel-time breakdown (torch.profiler) of one eager decode step at C=1 and of one
prefill at the first prompt length: where the step spends its time when it falls short.

``--weights-id PROFILE``: the weights are random payloads in that weight profile's formats
(engine/testing/synthetic_quant.py), bound as a real artifact of the profile is; bytes per step count the
payloads. ``--gpu-memory-limit GiB``: last, under that cap, the largest KV pool that runs (fit.py).

Weights are random (normal, std 0.02; a decode or prefill step costs the same whatever they are). The KV
of the "cached" decode context is zeros: reading it costs the same.

``--server`` replaces the rows above: per concurrency, the engine's decode step in process next to the TPOT and
TTFT a client of ``ninfer-serve`` (a subprocess on the same geometry and flags) sees through the openai SDK
(server.py; ``tiny-dense`` runs it on the CPU for its test).

Files: cli.py (arguments, the run, the JSON), server.py (``--server``), fit.py (what fits under --gpu-memory-limit), steps.py (device limits, bytes and FLOPs a step must move, the
engine steps timed through ``ModelRunner.execute``, the kernel profile), hf.py (``--vs-hf``).
"""

from __future__ import annotations

from engine.testing.bench.cli import bench, main, parse_args
from engine.testing.bench.hf import add_speedups, build_hf_model, hf_text_config, time_hf
from engine.testing.synthetic import GEOMETRIES

__all__ = [
    "GEOMETRIES",
    "add_speedups",
    "bench",
    "build_hf_model",
    "hf_text_config",
    "main",
    "parse_args",
    "time_hf",
]
