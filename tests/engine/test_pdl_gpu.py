"""NINFER_PDL=on through the real runner on the tiny artifacts: CUDA-graph decode (the Triton launches captured as
programmatic edges) gives exactly the greedy tokens of the same engine with PDL off, dense and MoE, bf16, with the
Triton GEMV on every decode linear (NINFER_GEMV=on: under ``auto`` the tiny shapes would take cuBLAS) and the split-K
reduce as a launch (dense) and in the GEMV's last split (MoE). Device only (`-m gpu`)."""

from __future__ import annotations

import pytest
import torch
from engine_harness import prompt, run, tiny_artifact

import kernels._dispatch
from engine.config import EngineConfig
from engine.core import EngineCore, load_artifact
from engine.request import SamplingParams
from kernels.pdl import pdl_enabled

pytestmark = pytest.mark.gpu

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


def _tokens(arch: str, items: list[list[int]]) -> tuple[list[list[int]], int]:
    art = load_artifact(tiny_artifact(arch), device="cuda", dtype=torch.bfloat16)
    flags = dict(max_context=512, max_concurrency=4, prefill_chunk=64, prefill_chunk_multiple=1)
    core = EngineCore(art.model, art.tokenizer, EngineConfig.from_flags(**flags, pending_timeout_ms=600_000))
    assert core.runner.graphs_captured
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
