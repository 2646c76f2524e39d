"""Host KV parking through the real engine (tiny dense model, float32, CPU): park on eviction, restore on
match, branching, evicting restore next to a running lane, a probe storm, LRU budget exhaustion.

Every step is followed by `check_integrity()` (pages, slots, checkpoints, host blocks and pins), and every
restored request is compared with the same prompt run cold in a fresh engine (DESIGN invariant 2).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from engine_harness import GREEDY, alone, make_core, one_thread, prompt

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.request import FinishEvent, SamplingParams, TokenEvent

PAGE = 16


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


class Driver:
    """Submit requests at chosen moments; step (checking integrity) until the named ones finish."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.tokens: dict[str, list[int]] = {}
        self.finish: dict[str, FinishEvent] = {}

    def add(self, rid: str, ids: Sequence[int], params: SamplingParams = GREEDY, checkpoints=()) -> None:
        assert self.core.add_request(rid, ids, params, checkpoints) is None
        self.tokens[rid] = []

    def step(self) -> None:
        for event in self.core.step():
            if isinstance(event, TokenEvent):
                self.tokens[event.request_id].extend(event.token_ids)
            else:
                self.finish[event.request_id] = event
        self.core.check_integrity()

    def until(self, *rids: str) -> None:
        while any(r not in self.finish for r in rids):
            assert self.core.has_work()
            self.step()

    def drain(self) -> None:
        while self.core.has_work():
            self.step()

    def run(self, rid: str, ids: Sequence[int], params: SamplingParams = GREEDY, checkpoints=()) -> list[int]:
        self.add(rid, ids, params, checkpoints)
        self.until(rid)
        return self.tokens[rid]


def assert_evictions_accounted(core: EngineCore) -> None:
    """Every device checkpoint eviction is a park (or a refused one), a member evicted inside another's
    park, or a skip with its reason."""
    s, planner = core.stats(), core.scheduler.host
    assert planner is not None
    parked = s.host_kv_parks + sum(s.host_kv_park_refusals.values()) + planner.num_co_evicted
    assert parked + sum(s.host_kv_park_skips.values()) == core.scheduler.prefix.num_evictions


def cold(ids: Sequence[int], params: SamplingParams = GREEDY) -> list[int]:
    return alone("dense", [ids], params)[0]


def long_params(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def test_session_evicted_by_a_side_request_restores_and_equals_cold():
    """C=1: a side request's reservation evicts the retained session; its next turn restores it."""
    core = make_core(page_size=PAGE, max_context=256, host_kv_cache_mib=1)  # 16 pages
    d = Driver(core)
    turn1 = prompt(100, 1)
    out1 = d.run("a1", turn1)
    d.run("side", prompt(40, 2), long_params(150))  # reserves 12 of 16 pages: the session is parked
    s = core.stats()
    assert (s.host_kv_parks, s.host_kv_entries, s.num_checkpoints) == (1, 1, 1)
    assert s.host_kv_park_bytes == s.host_kv_used_bytes > 0
    turn2 = turn1 + out1 + prompt(20, 3)
    prefill_before = core.stats().num_prefill_tokens
    out2 = d.run("a2", turn2)
    assert out2 == cold(turn2)
    finish = d.finish["a2"]
    assert finish.num_host_cached_tokens == finish.num_cached_tokens == len(turn1) + len(out1) - 1
    s = core.stats()
    assert s.num_prefill_tokens - prefill_before == len(turn2) - finish.num_cached_tokens  # only the rest
    assert s.host_kv_restores == 1 and s.host_kv_restore_bytes > 0
    assert s.host_kv_parks == 2  # restoring needed the side request's pages: it was parked in turn
    assert s.host_kv_entries == 1  # the restored entry (its last checkpoint) left the host


def test_branching_from_earlier_checkpoints_of_parked_sessions():
    """Rewinds to a message boundary restore that boundary; an entry holding a later checkpoint too
    stays parked after a branch restore, and the continuation then restores its last checkpoint."""
    core = make_core(page_size=PAGE, max_context=256, host_kv_cache_mib=1)
    d = Driver(core)
    turn1 = prompt(100, 11)
    out1 = d.run("a1", turn1, checkpoints=[40])  # checkpoints at 40 (boundary) and 105 (retained)
    device_branch = turn1[:40] + prompt(30, 12)
    assert d.run("b", device_branch) == cold(device_branch)  # a device hit at 40 refreshes it in the LRU
    assert d.finish["b"].num_cached_tokens == 40 and d.finish["b"].num_host_cached_tokens == 0
    # The side request evicts 105 first (parked with the state of the still resident 40), then 40, which
    # b's 75 extends: both leave together as one entry (40, 75), not one entry per checkpoint.
    d.run("side", prompt(30, 13), long_params(150))
    assert core.stats().host_kv_parks == 2
    assert sorted(core.host.entry(k).checkpoints for k in core.host.entry_keys) == [(40, 75), (40, 105)]
    branches = [turn1[:40] + prompt(25, seed) for seed in (14, 15)]
    for k, branch in enumerate(branches):
        assert d.run(f"c{k}", branch) == cold(branch)
        assert d.finish[f"c{k}"].num_host_cached_tokens == 40
    assert (40, 105) in [core.host.entry(k).checkpoints for k in core.host.entry_keys]  # kept by c1
    turn2 = turn1 + out1 + prompt(10, 16)
    assert d.run("a2", turn2) == cold(turn2)
    assert d.finish["a2"].num_host_cached_tokens == len(turn1) + len(out1) - 1
    assert core.stats().host_kv_restores == 3


def test_evicting_restore_next_to_a_running_lane():
    """C=2: lane 0 runs a long request throughout; sessions A and B take turns on lane 1 in a pool too
    small for both, so each return parks the other (never the running lane) and restores itself."""
    core = make_core(page_size=PAGE, max_context=256, max_concurrency=2, host_kv_cache_mib=1)  # 16 pages
    d = Driver(core)
    running, running_params = prompt(20, 21), long_params(200)  # grows page by page: ~7 pages by the end
    d.add("r", running, running_params)
    a1, b1 = prompt(60, 22), prompt(60, 23)
    out_a1 = d.run("a1", a1)
    out_b1 = d.run("b1", b1, long_params(60))  # B grows to 8 pages beside r's 6: A (5) is parked
    a2 = a1 + out_a1 + prompt(10, 24)
    out_a2 = d.run("a2", a2)  # 2 pages free, needs 5: B (idle) is parked, A restored
    b2 = b1 + out_b1 + prompt(10, 25)
    out_b2 = d.run("b2", b2)  # and the other way round
    assert "r" not in d.finish, "the running lane must outlive the sessions' turns"
    assert (out_a2, out_b2) == (cold(a2), cold(b2))
    assert d.finish["a2"].num_host_cached_tokens == len(a1) + len(out_a1) - 1
    assert d.finish["b2"].num_host_cached_tokens == len(b1) + len(out_b1) - 1
    s = core.stats()
    assert (s.host_kv_parks, s.host_kv_restores) == (3, 2)
    d.until("r")
    assert d.tokens["r"] == cold(running, running_params)


def test_probe_storm_moves_no_bytes():
    """C=1, a parked session, a busy lane and 40 queued requests: while they wait nothing is parked or
    restored and admission is not rescanned each step; afterwards every request is answered."""
    core = make_core(page_size=PAGE, max_context=256, host_kv_cache_mib=1, max_pending_requests=64)
    d = Driver(core)
    turn1 = prompt(60, 31)
    out1 = d.run("a1", turn1)
    d.add("busy", prompt(200, 32), long_params(40))  # its prompt takes 13 of 16 pages: the session is parked
    d.step()
    base = core.stats()
    assert base.host_kv_parks == 1 and base.num_running == 1
    storm = [turn1 + out1 + prompt(8, 100 + k) if k % 2 == 0 else prompt(50, 100 + k) for k in range(40)]
    for k, ids in enumerate(storm):
        d.add(f"s{k}", ids, SamplingParams(temperature=0.0, max_tokens=4))
    d.step()
    scans = core.stats().num_admission_scans
    for _ in range(30):
        d.step()
        s = core.stats()
        moved = (s.host_kv_parks, s.host_kv_restores, s.host_kv_park_bytes, s.host_kv_restore_bytes)
        assert moved == (base.host_kv_parks, 0, base.host_kv_park_bytes, 0)
        assert s.num_admission_scans == scans and s.num_waiting == 40
    d.drain()
    assert all(d.finish[f"s{k}"].reason.kind.value == "length" for k in range(40))
    s = core.stats()
    assert s.host_kv_restores >= 1  # the first continuation restored the session
    assert_evictions_accounted(core)
    first = next(k for k in range(0, 40, 2))
    assert d.tokens[f"s{first}"] == cold(storm[first], SamplingParams(temperature=0.0, max_tokens=4))


def test_budget_exhaustion_evicts_the_least_recently_parked():
    """1 MiB holds four 205-token sessions (61 blocks of 4 KiB each); the fifth park evicts the first."""
    core = make_core(page_size=PAGE, max_context=512, host_kv_cache_mib=1)  # 32 pages: 2 retained sessions
    d = Driver(core)
    turns = [prompt(200, 40 + k) for k in range(7)]
    outs = [d.run(f"t{k}", ids) for k, ids in enumerate(turns)]
    s = core.stats()
    assert (s.host_kv_parks, s.host_kv_entries, s.host_kv_evictions) == (5, 4, {"lru": 1})
    assert s.host_kv_used_bytes <= s.host_kv_capacity_bytes == 1 << 20
    back_first = turns[0] + outs[0] + prompt(5, 50)  # parked first, evicted: prefills cold
    assert d.run("back0", back_first) == cold(back_first)
    assert d.finish["back0"].num_cached_tokens == 0
    back_last = turns[4] + outs[4] + prompt(5, 51)  # parked last: restored
    assert d.run("back4", back_last) == cold(back_last)
    assert d.finish["back4"].num_host_cached_tokens == 205


def test_config_refusals_and_off():
    with pytest.raises(ValueError, match="host_kv_cache_mib=8: needs prefix reuse"):
        EngineConfig.from_flags(host_kv_cache_mib=8, prefix_reuse=False)
    with pytest.raises(ValueError, match="host_kv_cache_mib=-1"):
        EngineConfig.from_flags(host_kv_cache_mib=-1)
    core = make_core(page_size=PAGE, max_context=256)
    assert core.host is None and core.runner.host_copies is None and core.scheduler.host is None
    s = core.stats()
    assert (s.host_kv_capacity_bytes, s.host_kv_parks, s.host_kv_evictions) == (0, 0, {})


def test_serve_flag_maps_and_refuses_no_prefix_reuse(capsys):
    from api.serve import parse_args

    _, config, _ = parse_args(["--host-kv-cache-mib", "64"])
    assert config.cache.host_kv_cache_mib == 64
    with pytest.raises(SystemExit) as exc:
        parse_args(["--host-kv-cache-mib", "64", "--no-prefix-reuse"])
    assert exc.value.code == 2
    assert "host_kv_cache_mib=64: needs prefix reuse" in capsys.readouterr().err


def test_sessions_resume_from_their_prompt_end_when_templates_drop_the_last_answer():
    """Agent sessions whose next turn continues from the previous PROMPT (chat templates drop the last
    turn's reasoning), three sessions taking turns in a pool that holds about one: every later turn
    restores the previous prompt end from the host. The prompt end P and the generation end G of a turn
    leave the device together as one entry (before, each checkpoint was parked on its own, P and G in
    different entries, and a session parked at G alone could not resume)."""
    core = make_core(page_size=PAGE, max_context=256, host_kv_cache_mib=1)  # 16 pages
    d = Driver(core)
    prompts = {s: prompt(60, 60 + s) for s in range(3)}
    for turn in range(3):
        for s in range(3):
            ids = prompts[s]
            rid = f"s{s}t{turn}"
            d.run(rid, ids, long_params(24), checkpoints=[30, len(ids)])
            if turn:
                assert d.finish[rid].num_cached_tokens == len(ids) - 20, rid  # the previous prompt end
                assert d.finish[rid].num_host_cached_tokens == len(ids) - 20, rid
            assert d.tokens[rid] == cold(ids, long_params(24))
            prompts[s] = ids + prompt(20, 100 + 10 * s + turn)  # next turn: this prompt + new tokens
    s = core.stats()
    assert s.host_kv_restores == 6
    assert s.host_kv_parks <= 9  # at most one entry per session turn
    assert_evictions_accounted(core)
