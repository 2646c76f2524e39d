"""Host parking through the engine on CUDA (bf16, pinned slabs, the copy stream, CUDA graphs on): a
session parked by a side request and restored gives the tokens of the same turn reused from a device
checkpoint (both continue from the same state bytes, with the same chunking). Run with `-m gpu`."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from engine_harness import GREEDY, prompt, run, tiny_artifact

from engine.config import EngineConfig
from engine.core import EngineCore, load_artifact
from engine.request import SamplingParams

pytestmark = pytest.mark.gpu


def test_gpu_park_and_restore_through_the_engine_equals_device_reuse() -> None:
    assert torch.cuda.is_available(), "the gpu marker needs a CUDA device"
    loaded = load_artifact(tiny_artifact("dense"), device="cuda", dtype=torch.bfloat16)

    def core(**flags: Any) -> EngineCore:
        config = EngineConfig.from_flags(page_size=16, max_context=256, **flags)
        return EngineCore(loaded.model, loaded.tokenizer, config)

    turn1 = prompt(100, 1)
    device = core()
    (out1,), _ = run(device, [turn1])
    turn2 = turn1 + out1 + prompt(20, 3)
    (want,), finish = run(device, [turn2])
    assert finish["r1"].num_cached_tokens == 105

    parked = core(host_kv_cache_mib=64)
    copies = parked.runner.host_copies
    assert parked.host is not None and copies is not None
    assert all(s is not None and s.is_pinned() for s in copies.copier.slabs._slabs)
    assert run(parked, [turn1])[0][0] == out1
    run(parked, [prompt(40, 2)], SamplingParams(temperature=0.0, max_tokens=150, ignore_eos=True))
    (got,), finish = run(parked, [turn2], GREEDY)
    assert finish["r2"].num_host_cached_tokens == 105
    assert got == want
    copies.copier.synchronize()
    s = parked.stats()
    assert (s.host_kv_parks, s.host_kv_restores) == (2, 1)
    assert s.host_kv_park_seconds > 0 and s.host_kv_restore_seconds > 0
