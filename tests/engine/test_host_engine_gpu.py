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
from engine.request import FinishEvent, SamplingParams

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


def agent_sessions(core: EngineCore, num_sessions: int = 4, num_turns: int = 3) -> tuple[dict, dict]:
    """Concurrent agent sessions without an output limit: each turn resends the previous prompt short of its
    5-token generation prompt plus 24 new tokens, with message boundaries as checkpoint positions, and is
    submitted as soon as the session's previous turn ends. Returns (tokens, (cached, host-cached)) by turn id."""

    def turn_prompt(s: int, t: int) -> tuple[list[int], list[int]]:
        ids, bounds = prompt(60, 1000 + s), [40, 60]
        for k in range(t):
            ids += prompt(24, 2000 + 100 * s + k)
            bounds += [len(ids) - 12, len(ids)]
        return ids + prompt(5, 9), bounds

    params = SamplingParams(temperature=0.0, max_tokens=10_000, ignore_eos=True)  # clamped to the context
    turn = dict.fromkeys(range(num_sessions), 0)
    live: dict[str, int] = {}
    tokens: dict[str, list[int]] = {}
    cached: dict[str, tuple[int, int]] = {}

    def submit(s: int) -> None:
        rid = f"s{s}t{turn[s]}"
        ids, bounds = turn_prompt(s, turn[s])
        assert core.add_request(rid, ids, params, bounds) is None
        live[rid], tokens[rid] = s, []

    for s in range(num_sessions):
        submit(s)
    while core.has_work():
        for event in core.step():
            if isinstance(event, FinishEvent):
                cached[event.request_id] = (event.num_cached_tokens, event.num_host_cached_tokens)
                s = live.pop(event.request_id)
                turn[s] += 1
                if turn[s] < num_turns:
                    submit(s)
            else:
                tokens[event.request_id].extend(event.token_ids)
        core.check_integrity()
    return tokens, cached


def test_gpu_agent_sessions_preempted_on_a_one_context_pool_resume_every_turn_from_the_host() -> None:
    """Four sessions growing to the context on a pool of one context (preempted while decoding, parked, resumed
    by copy, overlap and graphs on): every later turn reuses the previous prompt up to its last message (60,
    then 84) from the host, as on a large pool, with the same greedy tokens and nothing recomputed."""
    assert torch.cuda.is_available(), "the gpu marker needs a CUDA device"
    loaded = load_artifact(tiny_artifact("dense"), device="cuda", dtype=torch.bfloat16)

    def core(**flags: Any) -> EngineCore:
        config = EngineConfig.from_flags(page_size=16, max_context=256, max_concurrency=4, **flags)
        return EngineCore(loaded.model, loaded.tokenizer, config)

    want, roomy = agent_sessions(core(kv_capacity=4096))
    pressured = core(kv_capacity=256, host_kv_cache_mib=16)
    got, cached = agent_sessions(pressured)
    assert got == want
    stats = pressured.stats()
    assert stats.num_preemptions >= 1 and stats.num_recomputed_tokens == 0
    assert {rid: c for rid, (c, _) in cached.items()} == {rid: c for rid, (c, _) in roomy.items()}
    assert {rid: c for rid, c in cached.items() if not rid.endswith("t0")} == {
        f"s{s}t{t}": (n, n) for s in range(4) for t, n in ((1, 60), (2, 84))
    }
