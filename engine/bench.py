"""`ninfer-bench`: speed at the real Qwen3.6-27B and 35B-A3B geometries, with random weights built on the GPU.

    ninfer-bench --synthetic qwen3.6-27b [--kv-dtype bf16|int8] [--prompt-len 7680,65536]
                 [--concurrency 1,2,4,8] [--decode-tokens 64] [--decode-context 1024] [--json OUT]
                 [--vs-hf [--hf-max-prompt-len 16384] [--hf-concurrency 1,8]]

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

Weights are random (normal, std 0.02; a decode or prefill step costs the same whatever they are). The KV
of the "cached" decode context is zeros: reading it costs the same.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine.config import KVDtype
from engine.model.config import ModelConfig
from engine.model.qwen3_5 import Qwen3_5ForCausalLM
from engine.request import SamplingParams
from engine.runner import ModelRunner
from engine.step import RowPlan, StepPlan
from engine.synthetic import GEOMETRIES, build_synthetic

if TYPE_CHECKING:
    from transformers import PreTrainedModel

PAGE_SIZE = 64
GREEDY = SamplingParams(temperature=0.0)


def _sig(seconds: float, digits: int = 6) -> float:
    """A time kept to ``digits`` significant digits (a fixed number of decimals loses short times)."""
    return float(f"{seconds:.{digits}g}")


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
    p.add_argument("--vs-hf", action="store_true", help="also time HF transformers on the same geometry")
    p.add_argument("--hf-max-prompt-len", type=int, default=16384,
                   help="--vs-hf: skip HF prefill above this length (one unchunked forward)")  # fmt: skip
    p.add_argument("--hf-concurrency", type=_ints, default=None,
                   help="--vs-hf: HF decode concurrencies (default: --concurrency)")  # fmt: skip
    p.add_argument("--hf-attn-implementation", default=None,
                   help="--vs-hf: HF attn_implementation (default: transformers' own, sdpa)")  # fmt: skip
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
) -> RowPlan:
    return RowPlan(
        request_id=rid, lane=slot, token_ids=tuple(tokens), start_pos=start, page_ids=pages, state_slot=slot,
        reset_state=reset, copy_state_from=None, save_state_to=None, num_sample=int(sample), sampling_params=GREEDY,
        num_output_tokens=0,
    )  # fmt: skip


def _step(runner: ModelRunner, step_id: int, rows: Sequence[RowPlan]) -> list[int]:
    result = runner.execute(StepPlan(step_id, tuple(rows), (), ()))
    return [token for tokens in result.sampled_token_ids for token in tokens]


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


def make_runner(model: Qwen3_5ForCausalLM, num_pages: int, slots: int, kv_dtype: KVDtype, graphs: bool,
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


# ---- HF transformers on the same geometry (--vs-hf) ------------------------------------------------

HF_CACHE = "DynamicCache"
HF_DECODE_METHOD = (
    "one model(next_ids, cache) forward per step, greedy argmax fed back and copied to the host (no generate)"
)
_HF_KERNELS = {  # the kernel HF looks for -> the function in transformers' modeling_qwen3_5
    "chunk_gated_delta_rule": "torch_chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule": "torch_recurrent_gated_delta_rule",
    "causal_conv1d_fn": "causal_conv1d_fn",
    "causal_conv1d_update": "causal_conv1d_update",
}


def hf_text_config(config: ModelConfig) -> Any:
    """transformers' own text config (``Qwen3_5TextConfig`` / ``Qwen3_5MoeTextConfig``) of this geometry."""
    from transformers import Qwen3_5MoeTextConfig, Qwen3_5TextConfig

    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": config.rope_theta,
                            "partial_rotary_factor": config.partial_rotary_factor}  # fmt: skip
    if config.mrope_section is not None:
        rope.update(mrope_section=list(config.mrope_section), mrope_interleaved=True)
    fields: dict[str, Any] = dict(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_hidden_layers=config.num_hidden_layers,
        layer_types=list(config.layer_types), num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads, head_dim=config.head_dim, rms_norm_eps=config.rms_norm_eps,
        linear_conv_kernel_dim=config.linear_conv_kernel_dim, linear_key_head_dim=config.linear_key_head_dim,
        linear_value_head_dim=config.linear_value_head_dim, linear_num_key_heads=config.linear_num_key_heads,
        linear_num_value_heads=config.linear_num_value_heads, tie_word_embeddings=config.tie_word_embeddings,
        max_position_embeddings=config.max_position_embeddings, rope_parameters=rope, hidden_act="silu",
    )  # fmt: skip
    if not config.is_moe:
        assert config.intermediate_size is not None, "ModelConfig validates it for a dense model"
        return Qwen3_5TextConfig(intermediate_size=config.intermediate_size, **fields)
    return Qwen3_5MoeTextConfig(
        num_experts=config.num_experts, num_experts_per_tok=config.num_experts_per_tok,
        moe_intermediate_size=config.moe_intermediate_size,
        shared_expert_intermediate_size=config.shared_expert_intermediate_size, **fields,
    )  # fmt: skip


_NOT_GEOMETRY = ("bos_token_id", "eos_token_ids", "dtype", "mtp_num_hidden_layers")


def build_hf_model(
    config: ModelConfig, *, device: torch.device | str = "cuda", dtype: torch.dtype = torch.bfloat16,
    seed: int = 0, attn_implementation: str | None = None,
) -> PreTrainedModel:  # fmt: skip
    """HF's ``Qwen3_5ForCausalLM`` / ``Qwen3_5MoeForCausalLM`` of this geometry, every tensor allocated and
    drawn (HF's own init: normal, std 0.02) on `device` under it as the default device: no host copy.
    RuntimeError when the config HF built does not read back as `config`."""
    from transformers import Qwen3_5ForCausalLM as HFDense
    from transformers import Qwen3_5MoeForCausalLM as HFMoe

    hf_config = hf_text_config(config)
    extra = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    torch.manual_seed(seed)
    with torch.device(device):
        model = (HFMoe if config.is_moe else HFDense)._from_config(hf_config, dtype=dtype, **extra)
    back = ModelConfig.from_hf(model.config.to_dict())
    diff = {f: (getattr(back, f), getattr(config, f)) for f in config.__dataclass_fields__
            if f not in _NOT_GEOMETRY and getattr(back, f) != getattr(config, f)}  # fmt: skip
    if diff:
        raise RuntimeError(f"HF model geometry differs from ours (HF, ours): {diff}")
    model.requires_grad_(False)
    return model.eval()


def _hf_kernels() -> dict[str, str]:
    """What each of HF's GDN / conv functions resolved to at import: fla's or causal_conv1d's kernel when
    importable, else HF's torch reference (``transformers...``); "?" when this transformers hides it."""
    import transformers.models.qwen3_5.modeling_qwen3_5 as modeling

    found = {}
    for kernel, attr in _HF_KERNELS.items():
        fn, source = getattr(modeling, attr, None), "?"
        while callable(fn) and source == "?":
            impl = inspect.getclosurevars(fn).nonlocals.get("implementation")
            if impl is not None:
                source = f"{impl.__module__}.{impl.__qualname__}"
            fn = getattr(fn, "__wrapped__", None)
        found[kernel] = source
    return found


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@functools.cache
def _cache_kwarg(model_class: type[torch.nn.Module]) -> str:
    """The forward's cache argument: ``past_key_values`` (transformers 5.17) or ``cache`` (later 5.x)."""
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def _hf_forward(model: PreTrainedModel, ids: torch.Tensor, cache: Any) -> torch.Tensor:
    """Next-token ids [B, 1] after ``ids`` [B, T], through HF's forward with its cache (logits of the last
    position only, as ours and ``generate`` compute)."""
    # NOTE: classes are hashable; mypy matches the nn.Module class object against Hashable through the
    # instance's unbound `__hash__` (a false positive with torch's Module, not with plain classes).
    kwarg = _cache_kwarg(type(model))  # type: ignore[arg-type]
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **{kwarg: cache})
    return out.logits[:, -1].argmax(dim=-1, keepdim=True)


def hf_prefill_seconds(model: PreTrainedModel, prompt_len: int, device: torch.device) -> float:
    """Seconds for one cold HF prefill of ``prompt_len`` tokens (one forward, a fresh cache)."""
    from transformers import DynamicCache

    ids = torch.randint(0, model.config.vocab_size, (1, prompt_len)).to(device)
    _sync(device)
    start = time.perf_counter()
    _hf_forward(model, ids, DynamicCache(config=model.config)).tolist()
    _sync(device)
    return time.perf_counter() - start


def hf_decode_seconds(
    model: PreTrainedModel, concurrency: int, context: int, warmup: int, steps: int, device: torch.device
) -> float:
    """Seconds per HF decode step of ``concurrency`` rows after ``context`` prompt tokens (untimed)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    ids = torch.randint(0, model.config.vocab_size, (concurrency, context)).to(device)
    next_ids = _hf_forward(model, ids, cache)
    for step in range(warmup + steps):
        if step == warmup:
            _sync(device)
            start = time.perf_counter()
        next_ids = _hf_forward(model, next_ids, cache)
        next_ids.tolist()  # one host copy per step, as ours (and generate's stopping check)
    _sync(device)
    seconds = (time.perf_counter() - start) / steps
    if cache.get_seq_length() != context + warmup + steps:  # the forward took our cache, not a fresh one
        raise RuntimeError(f"HF cache holds {cache.get_seq_length()} tokens, want {context + warmup + steps}")
    return seconds


def _out_of_memory(fn: Any, device: torch.device) -> tuple[Any, str | None]:
    """(fn(), None), or (None, the reason) when the device ran out of memory (the row is then skipped)."""
    try:
        return fn(), None
    except torch.OutOfMemoryError as exc:
        reason = "out of memory: " + str(exc).split("\n")[0][:200]
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return None, reason


def time_hf(
    config: ModelConfig, *, prompt_lens: Sequence[int] = (), max_prompt_len: int = 16384, prefill_runs: int = 3,
    concurrency: Sequence[int] = (), decode_context: int = 1024, decode_tokens: int = 64, decode_warmup: int = 4,
    device: torch.device | str = "cuda", dtype: torch.dtype = torch.bfloat16, seed: int = 0,
    attn_implementation: str | None = None, log: Any = None,
) -> dict[str, Any]:  # fmt: skip
    """Prefill tok/s per prompt length and decode tok/s per concurrency of HF transformers' model of
    `config` (built on `device`, freed before returning), timed as ours. Lengths above `max_prompt_len`,
    and rows the device has no memory for, come back as ``{"prompt_len": L, "skipped": reason}``
    (decode: ``{"concurrency": C, ..., "skipped": reason}``)."""
    import transformers

    dev = torch.device(device)
    log = log or (lambda msg: None)
    t0 = time.perf_counter()
    model = build_hf_model(
        config, device=dev, dtype=dtype, seed=seed, attn_implementation=attn_implementation
    )
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    result: dict[str, Any] = {
        "transformers": transformers.__version__,
        "model_class": type(model).__name__,
        "dtype": str(dtype).removeprefix("torch."),
        "build_s": round(time.perf_counter() - t0, 2),
        "weights_GB": round(nbytes / 1e9, 3),
        "attn_implementation": model.config._attn_implementation,
        "experts_implementation": getattr(model.config, "_experts_implementation", None) if config.is_moe else None,
        "kernels": _hf_kernels(),
        "cache": HF_CACHE,
        "decode_method": HF_DECODE_METHOD,
    }  # fmt: skip
    log(f"hf built {result['model_class']}: {result['weights_GB']} GB in {result['build_s']} s")
    with torch.inference_mode():
        result["prefill"] = [
            _hf_prefill_row(model, n, max_prompt_len, prefill_runs, dev, log) for n in prompt_lens
        ]
        result["decode"] = [
            _hf_decode_row(model, c, decode_context, decode_warmup, decode_tokens, dev, log)
            for c in concurrency
        ]
    del model
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return result


def _hf_prefill_row(
    model: PreTrainedModel, length: int, max_len: int, runs: int, device: torch.device, log: Any
) -> dict[str, Any]:
    row: dict[str, Any] = {"prompt_len": length}
    if length > max_len:
        row["skipped"] = f"longer than --hf-max-prompt-len {max_len} (HF prefills in one unchunked forward)"
    else:  # the first run untimed: warm-up (fla compiles and autotunes there)
        times, reason = _out_of_memory(
            lambda: [hf_prefill_seconds(model, length, device) for _ in range(1 + runs)][1:], device
        )
        if times is None:
            row["skipped"] = reason
        else:
            seconds = statistics.median(times)
            row.update(seconds=_sig(seconds), tok_s=round(length / seconds, 1),
                       runs_s=[_sig(t) for t in times])  # fmt: skip
    log(f"hf prefill {row}")
    return row


def _hf_decode_row(
    model: PreTrainedModel, c: int, context: int, warmup: int, steps: int, device: torch.device, log: Any
) -> dict[str, Any]:
    row: dict[str, Any] = {"concurrency": c, "context": context, "steps": steps}
    per_step, reason = _out_of_memory(
        lambda: hf_decode_seconds(model, c, context, warmup, steps, device), device
    )
    if per_step is None:
        row["skipped"] = reason
    else:
        row.update(step_ms=round(per_step * 1e3, 3), tok_s=round(c / per_step, 1))
    log(f"hf decode {row}")
    return row


def add_speedups(hf: dict[str, Any], prefill: Sequence[dict], decode: Sequence[dict]) -> None:
    """Puts ours beside each timed HF row, and ``speedup`` = ours / HF tok/s (decode: against our CUDA-graph
    row when there is one, and ``speedup_eager`` against our eager row)."""
    ours_prefill = {r["prompt_len"]: r["tok_s"] for r in prefill}
    for row in hf["prefill"]:
        if "tok_s" in row and row["prompt_len"] in ours_prefill:
            row["ours_tok_s"] = ours_prefill[row["prompt_len"]]
            row["speedup"] = round(row["ours_tok_s"] / row["tok_s"], 2)
    graphed = {r["concurrency"]: r["tok_s"] for r in decode if r["cuda_graph"]}
    eager = {r["concurrency"]: r["tok_s"] for r in decode if not r["cuda_graph"]}
    for row in hf["decode"]:
        c = row["concurrency"]
        if "tok_s" not in row:
            continue
        if c in graphed or c in eager:
            row["ours_tok_s"] = graphed.get(c, eager.get(c))
            row["speedup"] = round(row["ours_tok_s"] / row["tok_s"], 2)
        if c in graphed and c in eager:
            row["ours_eager_tok_s"] = eager[c]
            row["speedup_eager"] = round(eager[c] / row["tok_s"], 2)


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
        import fla

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
            row = {"prompt_len": length, "chunk": args.prefill_chunk, "seconds": _sig(seconds),
                   "tok_s": round(length / seconds, 1), "limit_tok_s": round(limit, 1),
                   "fraction_of_limit": round(length / seconds / limit, 3),
                   "runs_s": [_sig(t) for t in times]}  # fmt: skip
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

    if args.vs_hf:
        del model  # 27B is ~54 GB in bf16: ours goes before HF's is built
        gc.collect()
        torch.cuda.empty_cache()
        result["hf"] = time_hf(
            config,
            prompt_lens=() if args.skip_prefill else args.prompt_len,
            max_prompt_len=args.hf_max_prompt_len,
            prefill_runs=args.prefill_runs,
            concurrency=() if args.skip_decode else (args.hf_concurrency or args.concurrency),
            decode_context=args.decode_context,
            decode_tokens=args.decode_tokens,
            decode_warmup=args.decode_warmup,
            attn_implementation=args.hf_attn_implementation,
            log=_log,
        )
        add_speedups(result["hf"], result.get("prefill", ()), result.get("decode", ()))
        for kind in ("prefill", "decode"):
            for row in result["hf"][kind]:
                _log(f"hf {kind} vs ours {row}")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "ninfer-bench: needs a CUDA device (the synthetic geometries are built on the GPU)",
            file=sys.stderr,
        )
        return 2
    if args.vs_hf:
        try:
            from transformers import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM  # noqa: F401
        except ImportError as exc:
            print(f"ninfer-bench: --vs-hf needs transformers with the qwen3_5 models: {exc}", file=sys.stderr)
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
