"""`ninfer-bench --vs-hf`: HF transformers' own Qwen3.5 models of the same geometry, timed the same way."""

from __future__ import annotations

import functools
import gc
import inspect
import statistics
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from engine.model.config import ModelConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def round_sig(seconds: float, digits: int = 6) -> float:
    """A time kept to ``digits`` significant digits (a fixed number of decimals loses short times)."""
    return float(f"{seconds:.{digits}g}")


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
            row.update(seconds=round_sig(seconds), tok_s=round(length / seconds, 1),
                       runs_s=[round_sig(t) for t in times])  # fmt: skip
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
