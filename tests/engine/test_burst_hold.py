"""Burst admission in the serving loop (engine/serving.py): an idle engine holds its first step for announced
requests, never longer than `burst_wait_ms`, never while busy; a withdrawn announcement ends the hold; the
scheduler's prefill-step counters (one batched prefill for requests admitted together, mixed steps when a prefill
runs beside decoding lanes). Real loop threads on the tiny dense model."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from engine_harness import alone, make_core, one_thread, prompt, run, tiny_loaded

from engine.config import EngineConfig
from engine.request import FinishEvent, SamplingParams, TokenEvent
from engine.serving import AsyncEngine

GREEDY = SamplingParams(temperature=0.0, max_tokens=6)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield


@pytest.fixture
def engines() -> Iterator[list[AsyncEngine]]:
    made: list[AsyncEngine] = []
    yield made
    for engine in made:
        engine.shutdown(drain=False, timeout=10)


def started(engines: list[AsyncEngine], **flags: Any) -> AsyncEngine:
    flags.setdefault("max_context", 256)
    loaded = tiny_loaded("dense")
    engine = AsyncEngine(loaded.model, loaded.tokenizer, EngineConfig.from_flags(**flags), model_id="tiny")
    engines.append(engine)
    engine.start()
    return engine


async def tokens_of(
    engine: AsyncEngine, request_id: str, ids: list[int], params: SamplingParams = GREEDY
) -> list[int]:
    events = [e async for e in engine.generate(request_id, ids, params)]
    assert isinstance(events[-1], FinishEvent) and events[-1].reason.kind.value == "length", events[-1]
    return [t for e in events if isinstance(e, TokenEvent) for t in e.token_ids]


def wait_until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def test_an_idle_engine_holds_for_announced_requests_and_prefills_them_in_one_step(engines):
    engine = started(engines, max_concurrency=4, burst_wait_ms=1000)
    core = engine._core
    prompts = [prompt(9, 1), prompt(14, 2), prompt(5, 3)]

    async def main() -> list[list[int]]:
        for k in range(3):
            engine.announce(f"b{k}")
        first = asyncio.create_task(tokens_of(engine, "b0", prompts[0]))
        await asyncio.to_thread(wait_until, lambda: core.num_burst_holds == 1)
        await asyncio.sleep(0.05)  # still held: the other two are announced and not yet added
        assert core.scheduler.stats().num_steps == 0 and core.scheduler.num_waiting == 1
        rest = [asyncio.create_task(tokens_of(engine, f"b{k}", prompts[k])) for k in (1, 2)]
        return await asyncio.gather(first, *rest)

    got = asyncio.run(main())
    assert got == alone("dense", prompts)
    stats = core.stats()
    assert stats.num_burst_holds == 1
    # one batched prefill, then decode only
    assert stats.num_prefill_steps == 1 and stats.num_mixed_steps == 0


def test_a_withdrawn_announcement_ends_the_hold(engines):
    engine = started(engines, max_concurrency=2, burst_wait_ms=1000)
    core = engine._core

    async def main() -> float:
        engine.announce("never")
        task = asyncio.create_task(tokens_of(engine, "a", prompt(8, 4)))
        await asyncio.to_thread(wait_until, lambda: core.num_burst_holds == 1)
        withdrawn = time.monotonic()
        engine.withdraw("never")
        await task
        return time.monotonic() - withdrawn

    after_withdraw = asyncio.run(main())
    assert after_withdraw < 0.6, (
        f"the request finished {after_withdraw:.2f} s after the withdrawal (hold: 1 s)"
    )
    assert not engine._announced
    assert core.num_burst_timeouts == 0  # ended by the withdrawal, not by the wait running out


def test_the_hold_is_bounded_by_burst_wait_ms(engines):
    engine = started(engines, max_concurrency=2, burst_wait_ms=60)

    async def main() -> float:
        engine.announce("late")  # never arrives, never withdrawn
        start = time.monotonic()
        await tokens_of(engine, "a", prompt(8, 5))
        return time.monotonic() - start

    took = asyncio.run(main())
    assert took >= 0.06 and engine._core.num_burst_holds == 1
    assert engine.stats().num_burst_timeouts == 1  # it ran out with "late" still announced
    engine.withdraw("late")


def test_a_busy_engine_never_holds(engines):
    engine = started(engines, max_concurrency=2, burst_wait_ms=1000)
    core = engine._core
    long = SamplingParams(temperature=0.0, max_tokens=60)

    async def main() -> None:
        running = asyncio.create_task(tokens_of(engine, "busy", prompt(8, 6), long))
        await asyncio.to_thread(wait_until, lambda: core.stats().num_decode_tokens > 0)
        engine.announce("never")  # announced while a lane decodes: nothing may wait for it
        start = time.monotonic()
        await tokens_of(engine, "b", prompt(6, 7))
        assert time.monotonic() - start < 0.8
        await running

    asyncio.run(main())
    assert core.num_burst_holds == 0
    engine.withdraw("never")


def test_burst_wait_zero_ignores_announcements(engines):
    engine = started(engines, max_concurrency=2, burst_wait_ms=0)
    engine.announce("never")
    asyncio.run(tokens_of(engine, "a", prompt(8, 8)))
    assert engine._core.num_burst_holds == 0 and not engine._announced
    assert engine.stats().burst_wait_ms == 0


def test_requests_added_together_share_one_prefill_step_and_mixed_steps_are_counted():
    core = make_core(max_concurrency=8, prefill_chunk=512, prefix_reuse=False)
    prompts = [prompt(10 + k, 20 + k) for k in range(8)]
    got, _ = run(core, prompts)
    assert got == alone("dense", prompts)
    stats = core.stats()
    assert stats.num_prefill_steps == 1 and stats.num_mixed_steps == 0
    assert stats.num_prefill_tokens == sum(len(p) for p in prompts)
    # a prompt admitted while another lane decodes: a mixed step
    core.add_request("decoding", prompt(6, 40), SamplingParams(temperature=0.0, max_tokens=20))
    core.step()
    core.step()
    core.add_request("late", prompt(6, 41), GREEDY)
    while core.has_work():
        core.step()
    stats = core.stats()
    assert stats.num_prefill_steps == 3 and stats.num_mixed_steps == 1


def test_the_hold_waits_only_while_lanes_and_prefill_budget_are_left():
    core = make_core(max_concurrency=2, prefill_chunk=64, prefix_reuse=False)
    assert not core.can_batch_more()  # nothing waits
    core.add_request("a", prompt(20, 50), GREEDY)
    assert core.can_batch_more()
    core.add_request("b", prompt(20, 51), GREEDY)
    assert not core.can_batch_more()  # both lanes are spoken for
    core.abort("b")
    core.add_request("c", prompt(50, 52), GREEDY)
    assert not core.can_batch_more()  # 70 waiting tokens fill the 64-token prefill budget
    core.abort("c")
    core.step()
    assert not core.can_batch_more()  # "a" holds a lane: busy


def test_one_lane_never_holds(engines):
    engine = started(engines, max_concurrency=1, burst_wait_ms=1000)
    engine.announce("never")  # it could not share the step anyway: the one lane is spoken for
    asyncio.run(tokens_of(engine, "a", prompt(8, 9)))
    assert engine._core.num_burst_holds == 0
    engine.withdraw("never")


def test_a_hold_whose_requests_went_away_does_not_cut_the_next_one_short(engines):
    engine = started(engines, max_concurrency=2, burst_wait_ms=300)
    core = engine._core

    async def aborted_during_the_hold() -> None:
        engine.announce("never")
        stream = engine.generate("gone", prompt(8, 10), GREEDY)
        task = asyncio.create_task(anext(stream))
        await asyncio.to_thread(wait_until, lambda: core.num_burst_holds == 1)
        engine.abort("gone")  # the only waiting request leaves: the engine goes idle mid-hold
        assert isinstance(await task, FinishEvent)
        await stream.aclose()
        engine.withdraw("never")

    asyncio.run(aborted_during_the_hold())
    time.sleep(0.4)  # past the first hold's end

    async def burst() -> list[list[int]]:
        engine.announce("b")
        first = asyncio.create_task(tokens_of(engine, "a", prompt(8, 11)))
        await asyncio.to_thread(wait_until, lambda: core.num_burst_holds == 2)
        return [await tokens_of(engine, "b", prompt(9, 12)), await first]

    asyncio.run(burst())
    assert core.stats().num_prefill_steps == 1  # "a" was held for "b" again: one prefill step for both
