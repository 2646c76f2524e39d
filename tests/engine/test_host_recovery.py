"""Host KV parking when things go wrong or get crowded (tiny dense model, float32, CPU, real engine).

- An entry larger than the whole budget is refused at park time: its session re-prefills cold.
- A mismatched or corrupt entry is reported by the runner at restore time; the scheduler drops it and
  re-plans that lane as a cold prefill. Both give exactly the cold greedy tokens (DESIGN invariant 2).
- Per-request readiness: a restoring lane gets no row until its copies are reported complete, while
  the other lane keeps decoding.
- Storm: 100 requests at `--max-concurrency 1` with parked sessions: all answered or refused, bytes moved
  accounted to admitted requests, a bounded number of steps and admission scans.
"""

from __future__ import annotations

import pytest
from engine_harness import GREEDY, alone, make_core, one_thread, prompt
from test_host_engine import Driver, assert_evictions_accounted, cold

from engine.core import EngineCore
from engine.request import FinishEvent, SamplingParams
from engine.step import StepPlan, StepResult

PAGE = 16
SHORT = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


def record_outputs(core: EngineCore) -> list[StepPlan]:
    """Every `StepPlan` the runner executes, in order."""
    outputs: list[StepPlan] = []
    execute = core.runner.execute

    def recording(output: StepPlan) -> StepResult:
        outputs.append(output)
        return execute(output)

    core.runner.execute = recording  # type: ignore[method-assign]
    return outputs


def park_one_session(core: EngineCore, d: Driver, n: int, side: int, seed: int) -> list[int]:
    """Run a session of `n` prompt tokens, then a short side request of `side` tokens that evicts it."""
    turn1 = prompt(n, seed)
    out1 = d.run(f"a{seed}", turn1)
    d.run(f"side{seed}", prompt(side, seed + 1), SHORT)
    return turn1 + out1


def test_entry_larger_than_the_budget_reprefills_cold():
    core = make_core(page_size=PAGE, max_context=1280, host_kv_cache_mib=1)  # 80 pages, 1 MiB of host
    d = Driver(core)
    history = park_one_session(core, d, 1100, 200, 1)
    host = core.host
    assert host is not None
    need = host.geometry.entry_bytes(host.geometry.pages_for(len(history) - 1), 1, 0)
    assert need > host.blocks.capacity_bytes, "the session must not fit the budget"
    s = core.stats()
    assert (s.host_kv_parks, s.host_kv_entries, s.host_kv_park_refusals) == (0, 0, {"oversize": 1})
    turn2 = history + prompt(10, 3)
    assert d.run("a2", turn2) == alone("dense", [turn2], GREEDY, max_context=1280)[0]
    assert (d.finish["a2"].num_cached_tokens, d.finish["a2"].num_host_cached_tokens) == (0, 0)
    assert core.stats().host_kv_restores == 0


@pytest.mark.parametrize("fault", ["mismatch", "corrupt"])
def test_mismatched_or_corrupt_entry_is_dropped_and_prefills_cold(fault: str, monkeypatch):
    core = make_core(page_size=PAGE, max_context=256, host_kv_cache_mib=1)  # 16 pages
    d = Driver(core)
    history = park_one_session(core, d, 100, 180, 11)  # the side request reserves 12 of 16 pages
    host = core.host
    assert host is not None and core.stats().host_kv_entries == 1
    (key,) = host.entry_keys
    copier = core.runner.host_copies.copier  # type: ignore[union-attr]
    if fault == "mismatch":  # the cache the entry is restored into is not the one it was parked from
        check = copier._check_geometry

        def mismatched(cache, what: str) -> None:
            if what.startswith("unpark"):
                raise ValueError(f"{what}: cache geometry differs")
            check(cache, what)

        monkeypatch.setattr(copier, "_check_geometry", mismatched)
    else:  # its metadata no longer describes a restorable checkpoint (e.g. a damaged entry)

        def corrupt(cache, *, key, **kwargs):
            raise ValueError(f"unpark({key!r}): entry is corrupt")

        monkeypatch.setattr(copier, "unpark", corrupt)
    turn2 = history + prompt(12, 13)
    prefill_before = core.stats().num_prefill_tokens
    assert d.run("a2", turn2) == cold(turn2)
    finish = d.finish["a2"]
    assert (finish.num_cached_tokens, finish.num_host_cached_tokens) == (0, 0)
    s = core.stats()
    assert s.num_prefill_tokens - prefill_before == len(turn2)  # the whole prompt: cold
    assert s.host_kv_restores == 0 and key not in host  # dropped (the side request is parked now)
    assert s.host_kv_evictions.get(fault) == 1
    planner = core.scheduler.host
    assert planner is not None and (planner.num_restores, planner.num_restore_failures) == (0, 1)
    # The engine goes on parking and restoring afterwards.
    monkeypatch.undo()
    d.run("side2", prompt(180, 14), SHORT)
    turn3 = turn2 + d.tokens["a2"] + prompt(5, 15)
    assert d.run("a3", turn3) == cold(turn3)
    assert d.finish["a3"].num_host_cached_tokens == len(turn2) + len(d.tokens["a2"]) - 1


class SlowHandle:
    """A restore whose copies report complete only after `steps` polls (a CUDA copy still in flight)."""

    def __init__(self, handle, steps: int) -> None:
        self.handle, self.steps, self.polls = handle, steps, 0

    def done(self) -> bool:
        self.polls += 1
        return self.polls > self.steps

    def synchronize(self) -> None:
        self.steps = 0

    def wait(self, stream=None) -> None:
        pass


def test_restoring_lane_waits_for_its_copies_while_the_other_lane_decodes(monkeypatch):
    core = make_core(page_size=PAGE, max_context=256, max_concurrency=2, host_kv_cache_mib=1)  # 16 pages
    d = Driver(core)
    running, running_params = prompt(20, 21), SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    d.add("r", running, running_params)  # 5 pages throughout
    history = park_one_session(core, d, 60, 150, 22)  # the side request needs 10 pages: the session parks
    host = core.host
    assert host is not None and core.stats().host_kv_entries == 1
    copier = core.runner.host_copies.copier  # type: ignore[union-attr]
    unpark = copier.unpark
    handles: list[SlowHandle] = []

    def slow_unpark(cache, **kwargs):
        handles.append(SlowHandle(unpark(cache, **kwargs), steps=3))
        return handles[-1]

    monkeypatch.setattr(copier, "unpark", slow_unpark)
    outputs = record_outputs(core)
    turn2 = history + prompt(10, 24)
    out2 = d.run("a2", turn2)
    assert "r" not in d.finish, "the running lane must outlive the restore"
    assert out2 == cold(turn2) and d.finish["a2"].num_host_cached_tokens == len(history) - 1
    first = next(i for i, o in enumerate(outputs) if o.host_unparks)
    rows = [[row.request_id for row in o.rows] for o in outputs]
    assert rows[first : first + 4] == [["r"]] * 4  # the unpark's step and three more: r decodes alone
    assert "a2" in rows[first + 4] and len(handles) == 1
    d.until("r")
    assert d.tokens["r"] == alone("dense", [running], running_params, max_context=256)[0]


def test_storm_of_100_requests_with_parked_sessions():
    """C=1: three sessions parked, a busy lane, then 100 requests (half continue a parked session, half
    are new; 80 fit the queue, 20 are refused). Every request is answered or refused; every byte moved
    was a restore for an admitted request or a park of a checkpoint it evicted; nothing moves while
    the queue waits; steps and admission scans stay bounded (no spin)."""
    core = make_core(page_size=PAGE, max_context=256, host_kv_cache_mib=2, max_pending_requests=80)
    d = Driver(core)
    histories = [park_one_session(core, d, 40, 40, 31 + 2 * k) for k in range(3)]
    d.add("busy", prompt(30, 40), SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True))
    d.step()
    base = core.stats()
    assert base.host_kv_entries >= 2 and base.num_running == 1
    storm = [histories[k % 3] + prompt(6, 100 + k) if k % 2 == 0 else prompt(30, 100 + k) for k in range(100)]
    refused: dict[str, FinishEvent] = {}
    for k, ids in enumerate(storm):  # a continuation marks its session's end as a message boundary
        event = core.add_request(f"s{k}", ids, SHORT, [len(histories[k % 3])] if k % 2 == 0 else [])
        if event is None:
            d.tokens[f"s{k}"] = []
        else:
            refused[f"s{k}"] = event
    assert len(refused) == 20 and all(e.reason.kind.value == "rejected" for e in refused.values())
    d.step()
    scans = core.stats().num_admission_scans
    for _ in range(20):  # the busy lane holds the only lane: probes move nothing, no rescans
        d.step()
        s = core.stats()
        assert (s.host_kv_restores, s.host_kv_restore_bytes) == (base.host_kv_restores, 0)
        assert (s.host_kv_parks, s.host_kv_park_bytes) == (base.host_kv_parks, base.host_kv_park_bytes)
        assert s.num_admission_scans == scans and s.num_waiting == 80
    steps = 0
    while core.has_work():
        d.step()
        steps += 1
        assert steps < 2_000, "the engine spins"
    answered = [f"s{k}" for k in range(100) if f"s{k}" not in refused]
    assert all(d.finish[r].reason.kind.value == "length" and len(d.tokens[r]) == 2 for r in answered)
    s = core.stats()
    # Restores: exactly one per admitted request that reports host-cached tokens, bytes = their sizes.
    host = core.host
    assert host is not None
    restored = [d.finish[r].num_host_cached_tokens for r in answered if d.finish[r].num_host_cached_tokens]
    assert s.host_kv_restores == len(restored) >= 20  # branches from parked boundary checkpoints
    assert s.host_kv_restore_bytes == sum(
        host.geometry.entry_bytes(host.geometry.pages_for(n), 1, 0) for n in restored
    )
    # Every eviction (each made room for an admitted request or a retained finish) is accounted for; each
    # park is at most one max-context sequence.
    assert_evictions_accounted(core)
    assert s.host_kv_parks - base.host_kv_parks <= 2 * (len(answered) + 1)
    max_entry = host.geometry.entry_bytes(host.geometry.pages_for(256), 4, 0)
    assert s.host_kv_park_bytes <= s.host_kv_parks * max_entry
    # No spin: each step advanced a lane (<= 1 prefill chunk + 2 decodes per request, + the busy lane),
    # and admission rescans only follow arrivals and releases.
    assert steps <= 200 + 4 * len(answered)
    assert s.num_admission_scans - scans <= 2 * (len(answered) + 1)
    continuation = next(k for k in range(0, 100, 2) if f"s{k}" not in refused)
    assert d.tokens[f"s{continuation}"] == alone("dense", [storm[continuation]], SHORT, max_context=256)[0]
