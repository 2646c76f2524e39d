"""Overlap scheduling on the GPU: CUDA-graph decode steps feed `PREVIOUS_TOKEN` from the previous step's sampled
ids on the device (no host sync), and the streams equal the synchronous engine's, greedy and seeded.

Run on the device machine (`-m gpu`); the CPU suite deselects it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from engine_harness import prompt, run, tiny_artifact

from engine.config import EngineConfig
from engine.core import EngineCore, load_artifact
from engine.request import SamplingParams

pytestmark = pytest.mark.gpu


def _core(arch: str, **flags: Any) -> EngineCore:
    art = load_artifact(tiny_artifact(arch), device="cuda", dtype=torch.bfloat16)
    config = EngineConfig.from_flags(
        max_context=512, pending_timeout_ms=600_000, prefill_chunk_multiple=1, max_concurrency=4, **flags
    )
    return EngineCore(art.model, art.tokenizer, config)


@pytest.mark.parametrize("arch", ["dense", "moe"])
def test_overlapped_graph_decode_gives_the_synchronous_tokens(arch: str) -> None:
    items = [prompt(n, seed) for seed, n in enumerate([5, 17, 40, 66])]
    for params in (
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=0.8, top_k=40, seed=7, max_tokens=24, ignore_eos=True),
    ):
        sync = _core(arch, overlap=False)
        assert sync.overlap is False
        want = run(sync, items, params)[0]
        core = _core(arch, overlap=True)
        assert core.overlap is True and core.runner.graphs_captured
        assert run(core, items, params)[0] == want
        assert core.runner.num_overlapped_launches > 10 and core.runner.num_graph_steps > 10
