"""Overlap scheduling (`--overlap`): step N+1 is planned and launched before step N's result is committed,
and the token streams are exactly those of the synchronous engine.

Two levels: the scheduler with a fake runner that resolves `PREVIOUS_TOKEN` from its own previous step and
checks every row's KV against its state (so a row in flight that corrupts a retained checkpoint, or a wasted
token that reaches a stream, fails loudly), and the real engine on the tiny dense model (greedy and seeded
sampling, staggered arrivals, stop tokens and strings, max_tokens, a short pool that preempts, prefix reuse,
host parking), comparing overlap on with overlap off.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
from engine_harness import make_core, one_thread, prompt
from scheduler_harness import Driver, FakeRunner, context_token, make_scheduler, request

from engine.core import EngineCore
from engine.request import FinishEvent, FinishKind, SamplingParams, TokenEvent
from engine.step import PREVIOUS_TOKEN, StepPlan, StepResult


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


# ---- the scheduler, with a fake runner ------------------------------------------------------------


class OverlapRunner(FakeRunner):
    """The fake runner, resolving `PREVIOUS_TOKEN` from the tokens its previous step sampled."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.previous: dict[str, int] = {}
        self.num_previous_feeds = 0

    def execute(self, out: StepPlan) -> StepResult:
        rows = []
        for row in out.rows:
            if PREVIOUS_TOKEN in row.token_ids:
                self.num_previous_feeds += 1
                fed = tuple(
                    self.previous[row.request_id] if t == PREVIOUS_TOKEN else t for t in row.token_ids
                )
                row = replace(row, token_ids=fed)
            rows.append(row)
        result = super().execute(replace(out, rows=tuple(rows)))
        self.previous = {
            r.request_id: t[-1] for r, t in zip(out.rows, result.sampled_token_ids, strict=True) if t
        }
        return result


class OverlapDriver(Driver):
    """Runs the engine's overlapped step on the scheduler: plan N+1, "launch" it, then commit N."""

    def __init__(self, scheduler: Any) -> None:
        super().__init__(scheduler, OverlapRunner(scheduler))
        self.inflight: tuple[StepPlan, StepResult] | None = None
        self.num_sync_fallbacks = 0

    def step(self) -> StepPlan:
        s = self.scheduler
        inflight, self.inflight = self.inflight, None
        if inflight is not None and not s.can_plan_ahead():
            self.num_sync_fallbacks += 1
            self.record(s.commit(*inflight))
            inflight = None
        out = s.schedule()
        result = self.runner.execute(out)
        if inflight is not None:
            self.record(s.commit(*inflight))
        if out.overlappable and not out.is_empty:
            self.inflight = (out, result)
        else:
            self.record(s.commit(out, result))
        s.check_integrity()
        self.runner.check_checkpoints(s)
        self.num_steps += 1
        return out

    def run(self, max_steps: int = 10_000) -> None:
        # (No "a step with running lanes ran nothing" check: a lane whose token in flight ends it, by length or
        # as `ending`, gets no row, so a step may run nothing while its plan in flight is committed.)
        while self.scheduler.has_work() or self.inflight is not None:
            self.step()
            assert self.num_steps < max_steps, "the scheduler did not drain"


def _cold(prompt_ids: list[int], max_tokens: int, stop: int | None = None) -> list[int]:
    context, out = list(prompt_ids), []
    while len(out) < max_tokens:
        out.append(context_token(tuple(context)))
        context.append(out[-1])
        if out[-1] == stop:
            break
    return out


@pytest.mark.parametrize("mode", ["recompute", "prefix", "host"])
@pytest.mark.parametrize("seed", [0, 1])
def test_overlapped_scheduler_matches_cold_tokens_on_a_short_pool(mode: str, seed: int) -> None:
    """Random traffic with stop tokens (a wasted row each), shared prefixes and preemption: every stream is
    the cold one, no token follows a finish, and every checkpoint's pages agree with its state."""
    rng = random.Random(seed)

    def scheduler() -> Any:
        sched = make_scheduler(lanes=4, num_pages=10, page_size=4, max_context=40, prefill_chunk=rng.choice([3, 8]),
                               prefix_reuse=mode != "recompute", max_checkpoints=4, max_pending=32)  # fmt: skip
        sched.overlap = True
        if mode == "host":
            from test_scheduler_host import GEOMETRY

            from engine.cache.host import HostIndex
            from engine.cache.host_blocks import HostBudget

            sched.attach_host(HostIndex(GEOMETRY, HostBudget(40 * 32, slab_bytes=40 * 32, block_bytes=32)))
        return sched

    sched = scheduler()
    drv = OverlapDriver(sched)
    wanted: dict[str, list[int]] = {}
    for i in range(24):
        p = [rng.randrange(1, 9) for _ in range(rng.randrange(1, 14))]
        if rng.random() < 0.5:
            p = [7, 1, 7, 2, 7, 3][: rng.randrange(1, 7)] + p[:8]
        max_tokens = rng.randrange(1, 40 - len(p))
        cold = _cold(p, max_tokens)
        stop = cold[rng.randrange(len(cold))] if rng.random() < 0.5 else None
        rid = f"r{i}"
        assert drv.add(request(rid, p, max_tokens=max_tokens, stop_token_ids=(stop,) if stop else ())) is None
        wanted[rid] = _cold(p, max_tokens, stop)
        for _ in range(rng.randrange(0, 4)):
            drv.step()
    drv.run()
    assert drv.inflight is None
    assert drv.runner.num_previous_feeds > 0, "no row fed a token still in flight: nothing overlapped"
    assert sched.num_preemptions > 0 and drv.num_sync_fallbacks > 0, "the pool was never short"
    for rid, tokens in wanted.items():
        assert drv.tokens[rid] == tokens, rid
        assert len(drv.finishes[rid]) == 1 and drv.finishes[rid][0].num_output_tokens == len(tokens), rid
    if sched.prefix is not None:
        sched.prefix.clear()
    assert sched.pages.num_free == sched.pages.num_pages


def test_an_abort_with_a_row_in_flight_frees_the_lane_after_that_row() -> None:
    sched = make_scheduler(lanes=2, num_pages=16, page_size=4, max_context=40)
    sched.overlap = True
    drv = OverlapDriver(sched)
    drv.add(request("a", [1, 2, 3], max_tokens=20))
    drv.add(request("b", [4, 5, 6], max_tokens=6))
    for _ in range(4):
        drv.step()
    assert drv.inflight is not None and sched.lanes[0] is not None
    drv.record(sched.abort("a"))
    lane = sched.lanes[0]
    assert lane is not None and lane.ending is False, "the lane stays until its row in flight is committed"
    assert drv.reason("a").reason.kind is FinishKind.ABORTED
    sched.check_integrity()
    drv.run()
    assert sched.lanes == [None, None] and drv.tokens["b"] == _cold([4, 5, 6], 6)
    sched.prefix.clear()  # type: ignore[union-attr]
    assert sched.pages.num_free == sched.pages.num_pages


def test_a_synchronous_scheduler_refuses_a_second_plan_in_flight() -> None:
    sched = make_scheduler()
    sched.add_request(request("a", [1, 2]))
    sched.schedule()
    with pytest.raises(AssertionError, match="schedule\\(\\) twice"):
        sched.schedule()
    sched.overlap = True
    sched.schedule()  # one in flight, one being planned
    with pytest.raises(AssertionError, match="schedule\\(\\) twice"):
        sched.schedule()


# ---- the engine on the tiny model -----------------------------------------------------------------


Arrival = tuple[int, Any, SamplingParams]  # (step, prompt ids or a function of the tokens so far, params)


def run_staggered(
    core: EngineCore, arrivals: list[Arrival]
) -> tuple[dict[str, list[int]], dict[str, FinishEvent]]:
    """Add request k at step arrivals[k][0]; step until done. Every request's tokens and finish."""
    tokens: dict[str, list[int]] = {}
    finish: dict[str, FinishEvent] = {}
    step = 0
    pending = sorted(enumerate(arrivals), key=lambda x: x[1][0])
    while pending or core.has_work():
        while pending and pending[0][1][0] <= step:
            k, (_, ids, params) = pending.pop(0)
            assert core.add_request(f"q{k}", ids(tokens) if callable(ids) else ids, params) is None
        for event in core.step():
            if isinstance(event, TokenEvent):
                assert event.request_id not in finish, f"{event.request_id}: a token after its finish"
                tokens.setdefault(event.request_id, []).extend(event.token_ids)
            else:
                finish[event.request_id] = event
        core.check_integrity()
        step += 1
    return tokens, finish


def both(arrivals: list[Arrival], **flags: Any) -> tuple[Any, Any, EngineCore]:
    """(overlap off, overlap on) results of the same traffic, and the overlapped engine."""
    sync = run_staggered(make_core(overlap=False, **flags), arrivals)
    core = make_core(overlap=True, **flags)
    overlapped = run_staggered(core, arrivals)
    return sync, overlapped, core


def _summary(result: Any) -> tuple[dict[str, list[int]], dict[str, tuple[str, int]]]:
    tokens, finish = result
    return tokens, {k: (f.reason.kind.value, f.num_output_tokens) for k, f in finish.items()}


@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
def test_staggered_batched_streams_are_identical_with_overlap_on_and_off(sampling: str) -> None:
    def params(k: int) -> SamplingParams:
        if sampling == "greedy":
            return SamplingParams(temperature=0.0, max_tokens=4 + 3 * k)
        return SamplingParams(temperature=0.9, top_k=50, seed=100 + k, max_tokens=4 + 3 * k)

    arrivals = [
        (step, prompt(n, k), params(k)) for k, (step, n) in enumerate([(0, 5), (0, 11), (2, 7), (5, 3)])
    ]
    # after q1 ended, its conversation continued: reuses q1's retained sequence
    arrivals.append((40, lambda tokens: prompt(11, 1) + tokens["q1"] + [4242], params(4)))
    sync, overlapped, core = both(arrivals, max_concurrency=3)
    assert _summary(overlapped) == _summary(sync)
    assert all(f.reason.kind is FinishKind.LENGTH for f in overlapped[1].values())
    assert overlapped[1]["q4"].num_cached_tokens >= 11 and sync[1]["q4"].num_cached_tokens >= 11
    assert core.runner.num_overlapped_launches > 0


def test_stop_tokens_and_stop_strings_end_overlapped_streams_where_synchronous_ones_end() -> None:
    """A stop token or string at step N already has a row in step N+1: its token is discarded, never emitted."""
    base = [prompt(n, 10 + k) for k, n in enumerate([6, 9, 4])]
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    free, _ = run_staggered(make_core(overlap=False, max_concurrency=3), [(0, p, greedy) for p in base])
    tokenizer = make_core(overlap=False).tokenizer
    stop_id = free["q0"][4]  # the 5th token of request 0 stops it
    text = tokenizer.decode(free["q1"])
    stop_text = text[len(text) // 2 : len(text) // 2 + 3]  # a stop string inside request 1's answer
    arrivals = [
        (0, base[0], replace(greedy, stop_token_ids=(stop_id,))),
        (0, base[1], replace(greedy, stop=(stop_text,))),
        (1, base[2], greedy),
    ]
    sync, overlapped, core = both(arrivals, max_concurrency=3)
    assert _summary(overlapped) == _summary(sync)
    tokens, finish = overlapped
    assert (
        tokens["q0"] == free["q0"][: free["q0"].index(stop_id) + 1]
        and finish["q0"].reason.kind is FinishKind.STOP
    )
    assert finish["q1"].reason.kind is FinishKind.STOP and len(tokens["q1"]) < 12
    # The runner fed a row after each stop (the wasted one), yet the streams above end where they must.
    assert core.runner.num_overlapped_launches > 0


def test_prefix_reuse_and_preemption_with_host_parking_keep_overlapped_outputs() -> None:
    """A pool of one max_context for three lanes preempts (the engine steps synchronously for those
    decisions), host parking restores, and a repeated prompt reuses its prefix: outputs are unchanged."""
    params = SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True)
    prompts = [prompt(12, 20 + k) for k in range(3)]  # 3 x 26 tokens on a pool of 40
    arrivals = [(0, p, params) for p in prompts]
    for flags in ({"prefix_reuse": False}, {"host_kv_cache_mib": 1}):
        sync, overlapped, core = both(
            arrivals, page_size=8, max_context=40, kv_capacity=40, max_concurrency=3, **flags
        )
        assert _summary(overlapped) == _summary(sync), flags
        stats = core.stats()
        assert stats.num_preemptions > 0 and stats.overlap, flags
        if flags == {"prefix_reuse": False}:  # every resume recomputes what its lane had computed
            assert stats.num_recomputed_tokens >= 12 * stats.num_preemptions, stats
        assert core.runner.num_overlapped_launches > 0, flags
        if "host_kv_cache_mib" in flags:
            assert stats.host_kv_parks > 0 and stats.host_kv_restores > 0


def test_the_next_step_is_launched_before_the_previous_result_is_collected() -> None:
    """The observable ordering of overlap: launch N+1 precedes collect N (and never without overlap)."""
    arrivals = [(0, prompt(6, 30), SamplingParams(temperature=0.0, max_tokens=8))]
    for overlap in (False, True):
        core = make_core(overlap=overlap)
        run_staggered(core, arrivals)
        timeline = list(core.runner.timeline)
        launched = [step for kind, step in timeline if kind == "launch"]
        ahead = [
            n for n in launched if ("launch", n + 1) in timeline
            and timeline.index(("launch", n + 1)) < timeline.index(("collect", n))
        ]  # fmt: skip
        if overlap:
            assert len(ahead) >= 6 and core.runner.num_overlapped_launches == len(ahead), timeline
        else:
            assert not ahead and core.runner.num_overlapped_launches == 0, timeline


def test_rows_that_need_the_host_fall_back_to_the_synchronous_step() -> None:
    """Logprobs and a thinking budget need each token on the host before the next step: no step is overlapped.
    (Penalties do not: tests/engine/test_overlap_penalties.py.)"""
    ids = prompt(7, 40)
    for params in (
        SamplingParams(temperature=0.0, max_tokens=6, logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=6, thinking_budget=3),
    ):
        sync, overlapped, core = both([(0, ids, params)])
        assert _summary(overlapped) == _summary(sync)
        assert core.runner.num_overlapped_launches == 0


def test_overlap_defaults_off_on_the_cpu_and_the_flags_set_it() -> None:
    from engine.flags import add_engine_flags, engine_config

    assert make_core().overlap is False
    import argparse

    parser = argparse.ArgumentParser()
    add_engine_flags(parser)
    assert engine_config(parser.parse_args(["--overlap"]), None).overlap is True
    assert engine_config(parser.parse_args(["--no-overlap"]), None).overlap is False
    assert engine_config(parser.parse_args([]), None).overlap is None


def test_a_stream_that_falls_behind_gets_every_ready_token_in_one_event() -> None:
    """The consumer's event loop is blocked while the engine runs the whole request: the stream then hands
    over one `TokenEvent` with every token, then the finish (one SSE chunk instead of one per step)."""
    import asyncio
    import time

    from engine_harness import tiny_loaded

    from engine.config import EngineConfig
    from engine.serving import AsyncEngine

    loaded = tiny_loaded("dense")
    config = EngineConfig.from_flags(max_context=512, overlap=True)
    engine = AsyncEngine(loaded.model, loaded.tokenizer, config, model_id="tiny")
    engine.start()

    async def main() -> list[Any]:
        stream = engine.generate("slow", prompt(6, 50), SamplingParams(temperature=0.0, max_tokens=8))
        first = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0)  # submitted; now this loop falls behind the engine
        deadline = time.monotonic() + 120
        while engine.stats().num_requests_finished.get("length", 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.02)  # blocks the event loop: the engine's events queue up
        return [await first] + [event async for event in stream]

    try:
        events = asyncio.run(main())
    finally:
        engine.shutdown(drain=False, timeout=10)
    assert [type(e) for e in events] == [TokenEvent, FinishEvent], events
    assert len(events[0].token_ids) == 8 and events[0].num_output_tokens == 8
    assert events[1].num_output_tokens == 8


def test_bench_decode_runs_with_overlap_on_and_off() -> None:
    """`ninfer-bench --overlap / --no-overlap`: the decode loop launches step N+1 before collecting step N."""
    from engine_harness import tiny_loaded

    from engine.testing.bench.steps import make_runner, run_decode

    model = tiny_loaded("dense").model
    for overlap in (False, True):
        runner = make_runner(model, 8, 3, "bf16", False, 256)
        assert run_decode(runner, model.config.vocab_size, 2, 16, 1, 3, overlap) > 0
        assert runner.num_overlapped_launches == (3 if overlap else 0) and runner.num_steps == 4
