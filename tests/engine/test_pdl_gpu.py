"""NINFER_PDL=on through the real runner on the tiny artifacts: CUDA-graph decode (the Triton launches captured as
programmatic edges) gives exactly the greedy tokens of the same engine with PDL off, dense and MoE, bf16, with the
Triton GEMV on every decode linear (NINFER_GEMV=on: under ``auto`` the tiny shapes would take cuBLAS) and the split-K
reduce as a launch (dense) and in the GEMV's last split (MoE); and (session 12's kernels) the dense model with an int8
KV cache (the int8 decode attention, grouped and keys-major) and the tiny geometry in the groupwise-int profile (the
Gluon GEMVs with their weights loaded before the wait), both with the fused attention prologue on. Device only
(`-m gpu`; ``_tokens`` runs on the CPU too, where PDL is never on)."""

from __future__ import annotations

import pytest
import torch
from engine_harness import prompt, run, tiny_artifact

import kernels._dispatch
from engine.config import EngineConfig
from engine.core import EngineCore, load_artifact
from engine.model.config import ModelConfig
from engine.request import SamplingParams
from engine.testing.synthetic_quant import build_synthetic_quantized
from engine.testing.tiny import tiny_hf_config
from kernels.pdl import pdl_enabled

pytestmark = pytest.mark.gpu

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


def _tokens(
    arch: str,
    items: list[list[int]],
    kv_dtype: str = "bf16",
    weights_id: str | None = None,
    device: str = "cuda",
) -> tuple[list[list[int]], int]:
    """Greedy tokens of the tiny ``arch`` artifact (``weights_id``: its geometry with random weights in that
    profile instead, on its tokenizer) and the number of decode steps that replayed a CUDA graph."""
    art = load_artifact(tiny_artifact(arch), device=device, dtype=torch.bfloat16)
    model = art.model
    if weights_id is not None:
        model = build_synthetic_quantized(
            ModelConfig.from_hf(tiny_hf_config(arch)), weights_id, device=device
        )
    flags = dict(
        max_context=512, max_concurrency=4, prefill_chunk=64, prefill_chunk_multiple=1, kv_dtype=kv_dtype
    )
    core = EngineCore(model, art.tokenizer, EngineConfig.from_flags(**flags, pending_timeout_ms=600_000))
    assert core.runner.graphs_captured or device == "cpu"
    tokens, _ = run(core, items, GREEDY)
    return tokens, core.runner.num_graph_steps


@pytest.mark.parametrize(("arch", "reduce"), [("dense", "launch"), ("moe", "last")])
def test_graph_decode_with_pdl_gives_the_tokens_without(
    arch: str, reduce: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert torch.cuda.is_available(), "the gpu marker needs a CUDA device"
    monkeypatch.setattr(kernels._dispatch, "GEMV_MODE", "on")
    monkeypatch.setattr(kernels._dispatch, "SPLITK_REDUCE", reduce)
    items = [prompt(length, seed) for seed, length in enumerate([5, 40, 17, 66])]
    monkeypatch.setattr(kernels._dispatch, "PDL_MODE", "off")
    off, _ = _tokens(arch, items)
    monkeypatch.setattr(kernels._dispatch, "PDL_MODE", "on")
    on, graph_steps = _tokens(arch, items)
    assert graph_steps > 0
    if torch.cuda.get_device_capability()[0] >= 9:
        assert pdl_enabled(torch.device("cuda"))
    assert on == off


@pytest.mark.parametrize(
    ("kv_dtype", "weights_id", "int8_attention"),
    [("int8", None, "grouped"), ("int8", None, "keys_major"), ("bf16", "groupwise-int", "grouped")],
)
def test_graph_decode_with_pdl_gives_the_tokens_without_int8_kv_and_quantized(
    kv_dtype: str, weights_id: str | None, int8_attention: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert torch.cuda.is_available(), "the gpu marker needs a CUDA device"
    monkeypatch.setattr(kernels._dispatch, "ATTN_FUSE", "on")
    monkeypatch.setattr(kernels._dispatch, "INT8_ATTENTION", int8_attention)
    items = [prompt(length, seed) for seed, length in enumerate([5, 40, 17, 66])]
    monkeypatch.setattr(kernels._dispatch, "PDL_MODE", "off")
    off, _ = _tokens("dense", items, kv_dtype, weights_id)
    monkeypatch.setattr(kernels._dispatch, "PDL_MODE", "on")
    on, graph_steps = _tokens("dense", items, kv_dtype, weights_id)
    assert graph_steps > 0
    assert on == off
