"""`ninfer-bench`'s measurements: the device's limits, the bytes and FLOPs a step must move, the engine's own
prefill and decode steps through ``ModelRunner.execute``, and a kernel-time profile of a step.

Decode with ``overlap`` (engine/core.py's overlap scheduling, at the runner): step N+1 is built and launched
(its rows feed ``PREVIOUS_TOKEN``, the ids step N sampled, still on the device) before step N is collected,
so the host's per-step work hides behind the device's; without it each step waits for its ids first."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

from engine.config import KVDtype
from engine.model.config import ModelConfig
from engine.model.forward import kv_spec
from engine.model.qwen3_5 import Qwen3_5ForCausalLM
from engine.request import SamplingParams
from engine.runner import ModelRunner
from engine.step import PREVIOUS_TOKEN, RowPlan, StepPlan

PAGE_SIZE = 64
GREEDY = SamplingParams(temperature=0.0)


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


# ---- the synthetic model (engine/testing/synthetic.py builds it) ------------------------------------------


def weight_bytes(model: Qwen3_5ForCausalLM) -> dict[str, float]:
    """Bytes of every parameter and quantized payload, split into what a decode step reads whatever the routing
    is, the embedding table (only the fed rows are read) and the routed experts (only the chosen ones are
    read); ``params``: the model's logical weight count (a quantized [N, K] counts N * K), for FLOPs."""
    dense = embed = experts = 0
    tensors: list[tuple[str, torch.Tensor]] = list(model.named_parameters())
    tensors += [(n, t) for n, t in model.named_buffers() if n.rsplit(".", 1)[-1] == "payload"]
    for name, param in tensors:
        size = param.numel() * param.element_size()
        if ".embed_tokens." in f".{name}":
            embed += size
        elif ".experts." in name:
            experts += size
        else:
            dense += size
    return {"dense": dense, "embedding": embed, "experts": experts, **logical_params(model.config)}


def logical_params(config: ModelConfig) -> dict[str, float]:
    """The geometry's weight counts (a meta-device model: no memory): ``params_dense`` (all but the embedding
    and the routed experts) and ``params_experts``."""
    with torch.device("meta"):
        meta = Qwen3_5ForCausalLM(config)
    dense = experts = 0
    for name, param in meta.named_parameters():
        if ".experts." in name:
            experts += param.numel()
        elif "embed_tokens." not in name:
            dense += param.numel()
    return {"params_dense": dense, "params_experts": experts}


def kv_bytes_per_token(config: ModelConfig, kv_dtype: KVDtype = "bf16") -> float:
    """KV bytes one cached token takes over every KV layer, as the engine's pool stores it (int8: one byte a
    value plus the fp16 group scales)."""
    return kv_spec(config, torch.bfloat16, kv_dtype).page_bytes(PAGE_SIZE) / PAGE_SIZE


def lane_state_bytes(config: ModelConfig) -> float:
    """GDN recurrent (fp32) and conv (bf16) state one lane holds over all linear-attention layers."""
    state = config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim * 4
    conv = config.conv_dim * (config.linear_conv_kernel_dim - 1) * 2
    return config.num_linear_layers * (state + conv)


def decode_step_bytes(
    config: ModelConfig, weights: dict[str, float], concurrency: int, context: int, kv_dtype: KVDtype = "bf16"
) -> float:
    """Bytes one decode step of ``concurrency`` rows at ``context`` cached tokens must move."""
    total = weights["dense"] + concurrency * config.hidden_size * 2  # + the embedding rows fed
    if config.is_moe:
        e, k = config.num_experts, config.num_experts_per_tok
        reached = e * (1 - (1 - k / e) ** concurrency)  # expected distinct experts per layer
        total += weights["experts"] * reached / e
    total += concurrency * context * kv_bytes_per_token(config, kv_dtype)
    total += concurrency * 2 * lane_state_bytes(config)  # read + write
    return total


def prefill_flops_per_token(config: ModelConfig, weights: dict[str, float], prompt_len: int) -> float:
    """Matmul FLOPs per prompt token: linears each token runs (active experts only), causal attention
    (QK^T and PV over half the prompt on average), and the lm_head once per prompt. The GDN recurrence
    (chunked, ~3% of the linears at 27B) is left out."""
    linear_params = weights["params_dense"] - (config.vocab_size * config.hidden_size)  # lm_head apart
    if config.is_moe:
        linear_params += weights["params_experts"] * config.num_experts_per_tok / config.num_experts
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
    runner: ModelRunner,
    vocab: int,
    concurrency: int,
    context: int,
    warmup: int,
    steps: int,
    overlap: bool = False,
) -> float:
    """Seconds per decode step of ``concurrency`` rows (greedy, sampled tokens fed back; with ``overlap``
    through the device, launching each step before collecting the previous one)."""
    pages_per_seq = -(-(context + warmup + steps + 1) // PAGE_SIZE)
    pages = [tuple(range(i * pages_per_seq, (i + 1) * pages_per_seq)) for i in range(concurrency)]
    tokens = torch.randint(0, vocab, (concurrency,)).tolist()
    pending = None
    for step in range(warmup + steps):
        if step == warmup:
            if torch.cuda.is_available():  # (the CPU runs it too, in tests)
                torch.cuda.synchronize()
            start = time.perf_counter()
        fed = [[PREVIOUS_TOKEN] if pending is not None else [tokens[i]] for i in range(concurrency)]
        rows = [
            _request(f"d{i}", fed[i], context + step, pages[i], i, False, True) for i in range(concurrency)
        ]
        if not overlap:
            tokens = _step(runner, step, rows)
            continue
        launched = runner.launch(StepPlan(step, tuple(rows), (), ()))
        if pending is not None:
            runner.collect(pending)
        pending = launched
    if pending is not None:
        runner.collect(pending)
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
