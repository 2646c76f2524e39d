"""NINFER_ATTN_FUSE at the layer (`-m gpu`: the GPU, or the CPU under Triton's interpreter): a tiny model's gated
attention layer gives bitwise the same outputs and KV pages with the switch on as off, through a prefill step and a
decode step with a CUDA-graph padding row (slot -1), and both stay close to the torch references."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from kernel_device import interpreter_patches, kernel_device

import kernels._dispatch
from engine.core import load_artifact
from engine.model import allocate_model_cache, make_forward_batch
from engine.model.attention import GatedAttention
from engine.testing.tiny import build_tiny

pytestmark = pytest.mark.gpu

_PAGE = 16


def _rel_rms(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.double(), expected.double()
    return ((actual - expected).pow(2).mean().sqrt() / expected.pow(2).mean().sqrt()).item()


def _run_layer(model, layer: GatedAttention, device: str) -> list[torch.Tensor]:  # noqa: ANN001
    """A prefill step of two sequences (7 and 5 tokens), then a decode step of both plus a padding row; returns
    both steps' outputs and the layer's key and value pages."""
    config = model.config
    cache = allocate_model_cache(config, 6, _PAGE, 3, dtype=torch.bfloat16, device=device)
    gen = torch.Generator().manual_seed(3)
    pages = [[0, 1], [2, 3], [4]]
    prefill = make_forward_batch([[1] * 7, [2] * 5], [0, 0], pages[:2], [0, 1], _PAGE, device=device)
    decode = make_forward_batch([[3], [4], [5]], [7, 5, 0], pages, [0, 1, 2], _PAGE, device=device)
    slots = decode.slot_mapping.clone()
    slots[2] = -1  # the padding row of a captured decode graph: nothing stored
    decode = dataclasses.replace(decode, slot_mapping=slots)
    outs = []
    with torch.inference_mode():
        for batch in (prefill, decode):
            x = torch.randn(batch.num_tokens, config.hidden_size, generator=gen).bfloat16().to(device)
            outs.append(layer(x, model.model.rope(batch.positions), batch, cache))
    return [*outs, cache.key_cache[layer.kv_index].clone(), cache.value_cache[layer.kv_index].clone()]


def test_fused_attention_layer_is_bitwise_the_unfused_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    device = kernel_device()
    path = build_tiny(tmp_path / "tiny-dense.ninfer", arch="dense", seed=0)
    model = load_artifact(path, device=device, dtype=torch.bfloat16).model
    layer = next(m for m in model.modules() if isinstance(m, GatedAttention))
    results = {}
    with interpreter_patches():
        for mode in ("off", "on"):
            monkeypatch.setattr(kernels._dispatch, "ATTN_FUSE", mode)
            results[mode] = _run_layer(model, layer, device)
        monkeypatch.setattr(kernels._dispatch, "KERNELS_MODE", "ref")
        reference = _run_layer(model, layer, device)
    names = ("prefill out", "decode out", "key pages", "value pages")
    for name, on, off, ref in zip(names, results["on"], results["off"], reference, strict=True):
        assert torch.equal(on, off), f"{name}: {(on != off).sum().item()} of {on.numel()} entries differ"
        assert _rel_rms(on, ref) < 2e-2, f"{name}: {_rel_rms(on, ref):.3e} from the references"
