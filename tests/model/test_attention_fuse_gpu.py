"""NINFER_ATTN_FUSE at the layer (`-m gpu`: the GPU, or the CPU under Triton's interpreter): a tiny model's gated
attention layer gives bitwise the same outputs and KV pages with the switch on as off, through a prefill step and a
decode step with a CUDA-graph padding row (slot -1), and both stay close to the torch references; its decode step
launches 3 attention kernels with the switch on where it launched 7."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from kernel_device import interpreter_patches, kernel_device

import kernels._dispatch
from engine.core import load_artifact
from engine.model import allocate_model_cache, make_forward_batch
from engine.model.attention import GatedAttention
from engine.testing.tiny import build_tiny
from kernels._dispatch import INTERPRET

pytestmark = pytest.mark.gpu

_PAGE = 16


def _rel_rms(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.double(), expected.double()
    return ((actual - expected).pow(2).mean().sqrt() / expected.pow(2).mean().sqrt()).item()


# the kernels gated attention launches between its input projections and o_proj, fused or not
_ATTENTION_KERNELS = {
    "_rms_norm_kernel", "_apply_rope_qk_kernel", "_store_kv_kernel", "_qk_norm_rope_store_kernel",
    "_paged_attention_decode_kernel", "_paged_attention_reduce_kernel", "_sigmoid_gate_mul_kernel",
}  # fmt: skip


def _launched(fn: Callable[[], object]) -> list[str]:
    """The attention kernels ``fn`` launches, in order: counted at the interpreter's launch, or by the profiler."""
    names: list[str] = []
    if INTERPRET:
        import triton.runtime.interpreter as interpreter

        run = interpreter.InterpretedFunction.run

        def counting_run(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            names.append(self.fn.__name__)
            return run(self, *args, **kwargs)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(interpreter.InterpretedFunction, "run", counting_run)
            fn()
    else:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return [n for n in names if n in _ATTENTION_KERNELS]


def _run_layer(model: Any, layer: GatedAttention, device: str) -> tuple[list[torch.Tensor], list[str]]:
    """A prefill step of two sequences (7 and 5 tokens), then a decode step of both plus a padding row: both
    steps' outputs and the layer's key and value pages, and the attention kernels the decode step launched."""
    config = model.config
    cache = allocate_model_cache(config, 6, _PAGE, 3, dtype=torch.bfloat16, device=device)
    gen = torch.Generator().manual_seed(3)
    pages = [[0, 1], [2, 3], [4]]
    prefill = make_forward_batch([[1] * 7, [2] * 5], [0, 0], pages[:2], [0, 1], _PAGE, device=device)
    decode = make_forward_batch([[3], [4], [5]], [7, 5, 0], pages, [0, 1, 2], _PAGE, device=device)
    slots = decode.slot_mapping.clone()
    slots[2] = -1  # the padding row of a captured decode graph: nothing stored
    decode = dataclasses.replace(decode, slot_mapping=slots)
    x_prefill, x_decode = (
        torch.randn(n, config.hidden_size, generator=gen).bfloat16().to(device) for n in (12, 3)
    )
    outs: list[torch.Tensor] = []
    with torch.inference_mode():
        outs.append(layer(x_prefill, model.model.rope(prefill.positions), prefill, cache))
        rope = model.model.rope(decode.positions)
        launches = _launched(lambda: outs.append(layer(x_decode, rope, decode, cache)))
    pages_out = [cache.key_cache[layer.kv_index].clone(), cache.value_cache[layer.kv_index].clone()]
    return [*outs, *pages_out], launches


def test_fused_attention_layer_is_bitwise_the_unfused_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    device = kernel_device()
    path = build_tiny(tmp_path / "tiny-dense.ninfer", arch="dense", seed=0)
    model = load_artifact(path, device=device, dtype=torch.bfloat16).model
    layer = next(m for m in model.modules() if isinstance(m, GatedAttention))
    results, launches = {}, {}
    with interpreter_patches():
        for mode in ("off", "on"):
            monkeypatch.setattr(kernels._dispatch, "ATTN_FUSE", mode)
            results[mode], launches[mode] = _run_layer(model, layer, device)
        monkeypatch.setattr(kernels._dispatch, "KERNELS_MODE", "ref")
        reference, _ = _run_layer(model, layer, device)
    names = ("prefill out", "decode out", "key pages", "value pages")
    for name, on, off, ref in zip(names, results["on"], results["off"], reference, strict=True):
        assert torch.equal(on, off), f"{name}: {(on != off).sum().item()} of {on.numel()} entries differ"
        assert _rel_rms(on, ref) < 2e-2, f"{name}: {_rel_rms(on, ref):.3e} from the references"
    assert launches["off"] == [
        "_rms_norm_kernel", "_rms_norm_kernel", "_apply_rope_qk_kernel", "_store_kv_kernel",
        "_paged_attention_decode_kernel", "_paged_attention_reduce_kernel", "_sigmoid_gate_mul_kernel",
    ]  # fmt: skip
    assert launches["on"] == [
        "_qk_norm_rope_store_kernel",
        "_paged_attention_decode_kernel",
        "_paged_attention_reduce_kernel",
    ]
