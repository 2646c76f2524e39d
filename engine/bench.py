"""`ninfer-bench`: speed at the real Qwen3.6-27B and 35B-A3B geometries, with random weights built on the GPU.

    ninfer-bench --synthetic qwen3.6-27b [--kv-dtype bf16|int8] [--prompt-len 7680,65536]
                 [--concurrency 1,2,4,8] [--decode-tokens 64] [--decode-context 1024] [--json OUT]

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
``--profile`` adds a kernel-time breakdown (torch.profiler) of one eager decode step at C=1 and of one
prefill at the first prompt length: where the step spends its time when it falls short.

Weights are random (normal, std 0.02; a decode or prefill step costs the same whatever they are). The KV
of the "cached" decode context is zeros: reading it costs the same.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from engine.model.config import ModelConfig
from engine.model.qwen3_5 import Qwen3_5ForCausalLM
from engine.request import SamplingParams
from engine.runner import ModelRunner
from engine.scheduler.output import ScheduledRequest, SchedulerOutput
from engine.synthetic import GEOMETRIES, build_synthetic

PAGE_SIZE = 64
GREEDY = SamplingParams(temperature=0.0)


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers") from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers")
    return values


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ninfer-bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--synthetic", required=True, choices=sorted(GEOMETRIES), help="geometry, random weights")
    p.add_argument("--kv-dtype", default="bf16", choices=("bf16", "int8"))
    p.add_argument("--prompt-len", type=_ints, default=[7680], help="prefill lengths, comma-separated")
    p.add_argument("--prefill-chunk", type=int, default=8192, help="tokens per prefill step")
    p.add_argument("--prefill-runs", type=int, default=3, help="timed prefill runs per length (median)")
    p.add_argument("--concurrency", type=_ints, default=[1, 2, 4, 8], help="decode concurrencies")
    p.add_argument("--decode-tokens", type=int, default=64, help="timed decode steps per concurrency")
    p.add_argument("--decode-warmup", type=int, default=4, help="untimed decode steps first")
    p.add_argument("--decode-context", type=int, default=1024, help="tokens already cached per sequence")
    p.add_argument("--eager-decode-tokens", type=int, default=8,
                   help="also time this many eager (no-graph) decode steps per concurrency (0 = skip)")  # fmt: skip
    p.add_argument("--no-cuda-graph", action="store_true", help="decode eagerly")
    p.add_argument("--profile", action="store_true", help="kernel-time breakdown of decode (C=1) and prefill")
    p.add_argument("--skip-prefill", action="store_true")
    p.add_argument("--skip-decode", action="store_true")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    return p.parse_args(argv)


# ---- device limits -------------------------------------------------------------------------------


def _time_cuda(fn: Any, reps: int, warmup: int = 2) -> list[float]:
    """Seconds per call, one CUDA-event pair per call."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return times


def _read_seconds() -> tuple[float, int]:
    x = torch.empty(1 << 30, dtype=torch.float32, device="cuda").uniform_()
    return min(_time_cuda(x.sum, reps=10)), x.numel() * 4


def _matmul_seconds(n: int = 8192) -> float:
    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    return statistics.median(_time_cuda(lambda: torch.matmul(a, b), reps=20, warmup=5))


def measure_limits() -> dict[str, float]:
    read_s, nbytes = _read_seconds()
    mm_s = _matmul_seconds(8192)
    torch.cuda.empty_cache()
    return {"read_GBps": nbytes / read_s / 1e9, "bf16_matmul_TFLOPs": 2 * 8192**3 / mm_s / 1e12}


# ---- the synthetic model (engine/synthetic.py builds it) ------------------------------------------


def weight_bytes(model: Qwen3_5ForCausalLM) -> dict[str, float]:
    """Bytes of every parameter, split into what a decode step reads whatever the routing is, the embedding
    table (only the fed rows are read) and the routed experts (only the chosen ones are read)."""
    dense = embed = experts = 0
    for name, param in model.named_parameters():
        size = param.numel() * param.element_size()
        if name.endswith("embed_tokens.weight"):
            embed += size
        elif ".experts." in name:
            experts += size
        else:
            dense += size
    return {"dense": dense, "embedding": embed, "experts": experts}


def decode_step_bytes(
    config: ModelConfig, weights: dict[str, float], concurrency: int, context: int
) -> float:
    """Bytes one decode step of ``concurrency`` rows at ``context`` cached tokens must move."""
    total = weights["dense"] + concurrency * config.hidden_size * 2  # + the embedding rows fed
    if config.is_moe:
        e, k = config.num_experts, config.num_experts_per_tok
        reached = e * (1 - (1 - k / e) ** concurrency)  # expected distinct experts per layer
        total += weights["experts"] * reached / e
    kv_per_token = config.num_attention_layers * 2 * config.num_key_value_heads * config.head_dim * 2
    total += concurrency * context * kv_per_token
    state = config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim * 4
    conv = config.conv_dim * (config.linear_conv_kernel_dim - 1) * 2
    total += concurrency * config.num_linear_layers * 2 * (state + conv)  # read + write
    return total


def prefill_flops_per_token(config: ModelConfig, weights: dict[str, float], prompt_len: int) -> float:
    """Matmul FLOPs per prompt token: linears each token runs (active experts only), causal attention
    (QK^T and PV over half the prompt on average), and the lm_head once per prompt. The GDN recurrence
    (chunked, ~3% of the linears at 27B) is left out."""
    linear_params = weights["dense"] / 2 - (config.vocab_size * config.hidden_size)  # bf16; lm_head apart
    if config.is_moe:
        linear_params += weights["experts"] / 2 * config.num_experts_per_tok / config.num_experts
    attention = (
        config.num_attention_layers * 4 * config.num_attention_heads * config.head_dim * prompt_len / 2
    )
    lm_head = 2 * config.vocab_size * config.hidden_size / prompt_len
    return 2 * linear_params + attention + lm_head


# ---- the engine steps ----------------------------------------------------------------------------


def _request(
    rid: str, tokens: Sequence[int], start: int, pages: tuple[int, ...], slot: int, reset: bool, sample: bool
) -> ScheduledRequest:
    return ScheduledRequest(
        request_id=rid, lane=slot, token_ids=tuple(tokens), start_pos=start, page_ids=pages, state_slot=slot,
        reset_state=reset, copy_state_from=None, save_state_to=None, sample=sample, sampling_params=GREEDY,
        num_output_tokens=0,
    )  # fmt: skip


def _step(runner: ModelRunner, step_id: int, rows: Sequence[ScheduledRequest]) -> list[int]:
    return runner.execute(SchedulerOutput(step_id, tuple(rows), (), ()))


def run_prefill(runner: ModelRunner, vocab: int, prompt_len: int, chunk: int) -> float:
    """Seconds for one cold prefill of ``prompt_len`` tokens (every chunk one engine step)."""
    pages = tuple(range(-(-prompt_len // PAGE_SIZE)))
    tokens = torch.randint(0, vocab, (prompt_len,)).tolist()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for step, pos in enumerate(range(0, prompt_len, chunk)):
        end = min(pos + chunk, prompt_len)
        _step(runner, step, [_request("p", tokens[pos:end], pos, pages, 0, pos == 0, end == prompt_len)])
    torch.cuda.synchronize()
    return time.perf_counter() - start


def run_decode(
    runner: ModelRunner, vocab: int, concurrency: int, context: int, warmup: int, steps: int
) -> float:
    """Seconds per decode step of ``concurrency`` rows (greedy, sampled tokens fed back)."""
    pages_per_seq = -(-(context + warmup + steps + 1) // PAGE_SIZE)
    pages = [tuple(range(i * pages_per_seq, (i + 1) * pages_per_seq)) for i in range(concurrency)]
    tokens = torch.randint(0, vocab, (concurrency,)).tolist()
    elapsed = 0.0
    for step in range(warmup + steps):
        if step == warmup:
            torch.cuda.synchronize()
            start = time.perf_counter()
        rows = [
            _request(f"d{i}", [tokens[i]], context + step, pages[i], i, False, True)
            for i in range(concurrency)
        ]
        tokens = _step(runner, step, rows)
    elapsed = time.perf_counter() - start
    return elapsed / steps


def make_runner(model: Qwen3_5ForCausalLM, num_pages: int, slots: int, kv_dtype: str, graphs: bool,
                max_context: int) -> ModelRunner:  # fmt: skip
    return ModelRunner(
        model, num_pages=num_pages, page_size=PAGE_SIZE, num_state_slots=slots, kv_dtype=kv_dtype,
        cuda_graph=graphs, max_context=max_context,
    )  # fmt: skip


# ---- profile -------------------------------------------------------------------------------------

_CATEGORIES = (
    ("gdn", ("gated_delta", "chunk_", "recompute", "kkt", "solve_tril", "fwd_h", "fwd_o", "l2norm")),
    ("attention", ("paged_attention", "flash", "fmha", "attention", "sdpa", "cutlass_sm90_fmha")),
    ("matmul", ("gemm", "gemv", "nvjet", "cutlass", "xmma", "sm90_", "cublas", "splitk")),
    ("norm", ("rms_norm",)),
    ("conv", ("conv", "causal_conv")),
    ("store_kv", ("store_kv",)),
)


def _category(name: str) -> str:
    low = name.lower()
    for cat, keys in _CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "elementwise/other"


def profile_kernels(fn: Any) -> dict[str, Any]:
    """Device time of every kernel ``fn`` launches, by category and the top 15 by name."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    wall = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    wall = time.perf_counter() - wall
    kernels: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels.setdefault(event.name, []).append(event.device_time_total if hasattr(event, "device_time_total")
                                                     else event.cuda_time_total)  # fmt: skip
    totals: dict[str, float] = {}
    for name, times in kernels.items():
        totals[_category(name)] = totals.get(_category(name), 0.0) + sum(times)
    top = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:15]
    return {
        "wall_ms_under_profiler": round(wall * 1e3, 2),
        "kernel_ms_total": round(sum(totals.values()) / 1e3, 3),
        "num_kernels": sum(len(t) for t in kernels.values()),
        "by_category_ms": {k: round(v / 1e3, 3) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])},
        "top_kernels": [
            {"name": name[:120], "calls": len(t), "ms": round(sum(t) / 1e3, 3), "category": _category(name)}
            for name, t in top
        ],
    }


# ---- main ----------------------------------------------------------------------------------------


def _commit() -> str:
    if os.environ.get("NINFER_COMMIT"):
        return os.environ["NINFER_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _log(msg: str) -> None:
    print(f"[ninfer-bench] {msg}", flush=True)


def bench(args: argparse.Namespace) -> dict[str, Any]:
    config = GEOMETRIES[args.synthetic]
    result: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "commit": _commit(),
        "command": "ninfer-bench " + " ".join(sys.argv[1:]),
        "software": {"torch": torch.__version__, "python": platform.python_version()},
        "geometry": args.synthetic,
        "kv_dtype": args.kv_dtype,
        "cuda_graph": not args.no_cuda_graph,
    }
    try:
        import triton

        result["software"]["triton"] = triton.__version__
        import fla  # type: ignore[import-not-found]

        result["software"]["fla"] = getattr(fla, "__version__", "?")
    except ImportError:
        pass
    limits = measure_limits()
    result["limits"] = {k: round(v, 1) for k, v in limits.items()}
    _log(f"limits: {result['limits']}")
    model = build_synthetic(config)
    weights = weight_bytes(model)
    result["weights_GB"] = {k: round(v / 1e9, 3) for k, v in weights.items()}
    _log(f"built {args.synthetic}: {result['weights_GB']} GB")
    bandwidth = limits["read_GBps"] * 1e9
    flop_rate = limits["bf16_matmul_TFLOPs"] * 1e12

    if not args.skip_prefill:
        longest = max(args.prompt_len)
        runner = make_runner(model, -(-longest // PAGE_SIZE) + 1, 2, args.kv_dtype, False, longest)
        rows = []
        for length in args.prompt_len:
            run_prefill(runner, config.vocab_size, length, args.prefill_chunk)  # warm-up: compiles, autotunes
            times = [run_prefill(runner, config.vocab_size, length, args.prefill_chunk)
                     for _ in range(args.prefill_runs)]  # fmt: skip
            seconds = statistics.median(times)
            limit = flop_rate / prefill_flops_per_token(config, weights, length)
            row = {"prompt_len": length, "chunk": args.prefill_chunk, "seconds": round(seconds, 4),
                   "tok_s": round(length / seconds, 1), "limit_tok_s": round(limit, 1),
                   "fraction_of_limit": round(length / seconds / limit, 3),
                   "runs_s": [round(t, 4) for t in times]}  # fmt: skip
            _log(f"prefill {row}")
            rows.append(row)
        result["prefill"] = rows
        if args.profile:
            length = args.prompt_len[0]
            result["profile_prefill"] = {
                "prompt_len": length,
                **profile_kernels(lambda: run_prefill(runner, config.vocab_size, length, args.prefill_chunk)),
            }
            _log(f"prefill profile: {result['profile_prefill']['by_category_ms']}")
        del runner
        gc.collect()
        torch.cuda.empty_cache()

    if not args.skip_decode:
        max_c = max(args.concurrency)
        steps_budget = args.decode_warmup + max(args.decode_tokens, args.eager_decode_tokens) + 1
        max_context = args.decode_context + steps_budget
        pages = max_c * -(-max_context // PAGE_SIZE) + 1
        rows = []
        for graphs in (False,) if args.no_cuda_graph else (True, False):
            steps = args.decode_tokens if graphs or args.no_cuda_graph else args.eager_decode_tokens
            if steps <= 0:
                continue
            t0 = time.perf_counter()
            runner = make_runner(model, pages, max_c + 1, args.kv_dtype, graphs, max_context)
            if graphs:
                result["graph_capture_s"] = round(time.perf_counter() - t0, 2)
            for c in args.concurrency:
                per_step = run_decode(
                    runner, config.vocab_size, c, args.decode_context, args.decode_warmup, steps
                )
                nbytes = decode_step_bytes(config, weights, c, args.decode_context + steps // 2)
                limit = c * bandwidth / nbytes
                row = {"concurrency": c, "cuda_graph": graphs and runner.graphs_captured,
                       "context": args.decode_context, "steps": steps, "step_ms": round(per_step * 1e3, 3),
                       "tok_s": round(c / per_step, 1), "bytes_per_step_GB": round(nbytes / 1e9, 3),
                       "limit_tok_s": round(limit, 1), "fraction_of_limit": round(c / per_step / limit, 3)}  # fmt: skip
                _log(f"decode {row}")
                rows.append(row)
            if args.profile and not graphs:
                result["profile_decode_eager_c1"] = profile_kernels(
                    lambda r=runner: run_decode(r, config.vocab_size, 1, args.decode_context, 0, 1)
                )
                _log(f"decode profile: {result['profile_decode_eager_c1']['by_category_ms']}")
            del runner
            gc.collect()
            torch.cuda.empty_cache()
        result["decode"] = rows
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "ninfer-bench: needs a CUDA device (the synthetic geometries are built on the GPU)",
            file=sys.stderr,
        )
        return 2
    result = bench(args)
    text = json.dumps(result, indent=1)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
