"""Overlap scheduling on the GPU: CUDA-graph decode steps feed `PREVIOUS_TOKEN` from the previous step's sampled
ids on the device (no host sync), and the streams equal the synchronous engine's, greedy and seeded; the MoE
model's default sampling (presence penalty 1.5: device-resident counts, engine/runner/penalties.py) overlaps too,
and an overlapped sampled, penalized decode launch makes no synchronizing copy.

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
from engine.runner.pending import Launched
from engine.step import StepPlan

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
        core = _core(arch)  # CUDA: overlap is on by default
        assert core.overlap is True and core.runner.graphs_captured
        assert run(core, items, params)[0] == want
        assert core.runner.num_overlapped_launches > 10 and core.runner.num_graph_steps > 10


# The MoE preset's distribution (temperature 1, top-k 20, top-p 0.95, presence penalty 1.5) with a per-request seed,
# so the two engines' streams can be compared.
MOE_DEFAULT = SamplingParams(seed=11, max_tokens=24, ignore_eos=True)


def test_moe_default_sampling_overlaps_and_gives_the_synchronous_tokens() -> None:
    items = [prompt(n, seed) for seed, n in enumerate([5, 17, 40, 66])]
    sync = _core("moe", overlap=False)
    resolved = sync.resolve(MOE_DEFAULT)
    assert resolved.presence_penalty == 1.5 and resolved.temperature == 1.0 and resolved.top_k == 20
    want = run(sync, items, MOE_DEFAULT)[0]
    core = _core("moe", overlap=True)
    assert run(core, items, MOE_DEFAULT)[0] == want
    assert core.runner.num_overlapped_launches > 10 and core.runner.num_graph_steps > 10


def test_an_overlapped_penalized_sampled_decode_launch_makes_no_synchronizing_copy() -> None:
    """Every decode launch after the first two graph steps (first use: generators, penalty rows) runs under
    `torch.cuda.set_sync_debug_mode("error")`: a pageable host-to-device copy or a read-back raises."""
    core = _core("moe", overlap=True)
    runner = core.runner
    launch = runner.launch
    checked = 0

    def strict_launch(plan: StepPlan) -> Launched:
        nonlocal checked
        decode = bool(plan.rows) and all(row.num_tokens == 1 and row.num_sample == 1 for row in plan.rows)
        if not (decode and plan.overlappable and runner.num_graph_steps >= 2):
            return launch(plan)
        before = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            launched = launch(plan)
        finally:
            torch.cuda.set_sync_debug_mode(before)
        assert launched.in_flight, "the step sampled through the host"
        checked += 1
        return launched

    runner.launch = strict_launch  # type: ignore[method-assign]
    run(core, [prompt(n, seed) for seed, n in enumerate([5, 17, 40])], MOE_DEFAULT)
    assert checked > 10 and runner.num_overlapped_launches > 10
