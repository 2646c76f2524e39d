"""AsyncEngine: streams, abort and disconnect, admission answers, the loop not spinning, shutdown,
and a failing model ending every stream. Each test drives a real loop thread on the tiny dense model."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from engine_harness import alone, one_thread, prompt, tiny_loaded

from engine.config import EngineConfig
from engine.request import FinishEvent, FinishKind, RejectCode, SamplingParams, TokenEvent
from engine.serving import AsyncEngine

GREEDY = SamplingParams(temperature=0.0, max_tokens=6)


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


def make_engine(**flags: Any) -> AsyncEngine:
    flags.setdefault("max_context", 512)
    loaded = tiny_loaded("dense")
    engine = AsyncEngine(loaded.model, loaded.tokenizer, EngineConfig.from_flags(**flags), model_id="tiny")
    engine.start()
    return engine


@pytest.fixture
def engines() -> Iterator[list[AsyncEngine]]:
    made: list[AsyncEngine] = []
    yield made
    for engine in made:
        engine.shutdown(drain=False, timeout=10)


async def collect(engine: AsyncEngine, request_id: str, ids: list[int], params: SamplingParams = GREEDY):
    """(token ids, the events in order)."""
    events = [e async for e in engine.generate(request_id, ids, params)]
    tokens = [t for e in events if isinstance(e, TokenEvent) for t in e.token_ids]
    return tokens, events


def finished_cleanly(engine: AsyncEngine) -> None:
    engine.shutdown(drain=True, timeout=10)
    assert not engine.is_running
    engine._core.check_integrity()
    stats = engine._core.stats()
    assert stats.num_running == 0 and stats.num_waiting == 0


def test_streams_end_in_exactly_one_finish_event_and_match_the_engine_alone(engines):
    engine = make_engine(max_concurrency=2)
    engines.append(engine)
    prompts = [prompt(12, 1), prompt(30, 2), prompt(7, 3)]

    async def main():
        return await asyncio.gather(*(collect(engine, f"s{k}", p) for k, p in enumerate(prompts)))

    results = asyncio.run(main())
    for _, events in results:
        assert [type(e) for e in events] == [TokenEvent] * 6 + [FinishEvent]
        assert events[-1].reason.kind is FinishKind.LENGTH and events[-1].num_output_tokens == 6
    assert [tokens for tokens, _ in results] == alone("dense", prompts)
    stats = engine.stats()
    assert stats.num_requests_finished == {"length": 3} and stats.num_decode_tokens > 0
    finished_cleanly(engine)


def test_abort_and_client_disconnect_free_the_lane_while_others_continue(engines):
    engine = make_engine(max_concurrency=3, page_size=16)
    engines.append(engine)
    survivor = prompt(20, 4)
    long = SamplingParams(temperature=0.0, max_tokens=40)

    async def main():
        survivor_task = asyncio.create_task(collect(engine, "keep", survivor))
        aborted: list[Any] = []

        async def abort_after_two():
            async for event in engine.generate("abort-me", prompt(25, 5), long):
                aborted.append(event)
                if len(aborted) == 2:
                    engine.abort("abort-me")

        async def disconnect_after_two():
            n = 0
            async for _ in engine.generate("gone", prompt(25, 6), long):
                n += 1
                if n == 2:
                    break  # the client went away: the engine must abort the request itself

        await asyncio.gather(abort_after_two(), disconnect_after_two())
        return await survivor_task, aborted

    (tokens, _), aborted = asyncio.run(main())
    assert isinstance(aborted[-1], FinishEvent) and aborted[-1].reason.kind is FinishKind.ABORTED
    assert tokens == alone("dense", [survivor], page_size=16)[0]
    deadline = time.monotonic() + 5
    while engine.stats().num_requests_finished.get("aborted", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.stats().num_requests_finished == {"aborted": 2, "length": 1}
    finished_cleanly(engine)


def test_impossible_request_is_refused_at_once_with_the_numbers(engines):
    engine = make_engine(max_context=64)
    engines.append(engine)
    _, events = asyncio.run(collect(engine, "big", prompt(70, 1)))
    (event,) = events
    assert event.reason.kind is FinishKind.REJECTED and event.reason.code is RejectCode.CONTEXT_LENGTH
    assert "70 tokens" in event.reason.message and "max_context is 64" in event.reason.message
    assert engine.stats().num_forward_steps == 0

    async def bad_ids():
        return [e async for e in engine.generate("bad", [10**9], GREEDY)]

    with pytest.raises(ValueError, match="outside the vocabulary"):
        asyncio.run(bad_ids())


def test_queue_full_and_pending_timeout_answer(engines):
    engine = make_engine(max_concurrency=1, max_pending_requests=1, pending_timeout_ms=150)
    engines.append(engine)
    slow = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)

    async def main():
        first = asyncio.create_task(collect(engine, "first", prompt(10, 1), slow))
        while engine.stats().num_running == 0:
            await asyncio.sleep(0.005)
        waiting = asyncio.create_task(collect(engine, "waits", prompt(10, 2)))
        while engine.stats().num_waiting == 0:
            await asyncio.sleep(0.005)
        _, full = await collect(engine, "full", prompt(10, 3))
        _, timed_out = await waiting
        engine.abort("first")
        _, first_events = await first
        return full, timed_out, first_events

    full, timed_out, first_events = asyncio.run(main())
    assert [e.reason.code for e in full] == [RejectCode.OVERLOADED]
    assert "1 lanes + 1 pending places" in full[0].reason.message
    assert [e.reason.code for e in timed_out] == [RejectCode.QUEUE_TIMEOUT]
    assert "pending timeout is 150 ms" in timed_out[0].reason.message
    assert first_events[-1].reason.kind is FinishKind.ABORTED
    finished_cleanly(engine)


def test_hundred_queued_requests_at_one_lane_complete_without_the_loop_spinning(engines):
    engine = make_engine(max_concurrency=1, max_pending_requests=100, prefix_reuse=False)
    engines.append(engine)
    params = SamplingParams(temperature=0.0, max_tokens=2)

    async def main():
        return await asyncio.gather(*(collect(engine, f"q{k}", prompt(4, k), params) for k in range(100)))

    results = asyncio.run(main())
    assert all(len(tokens) == 2 and events[-1].reason.kind is FinishKind.LENGTH for tokens, events in results)
    stats = engine.stats()
    # Each request is one prefill step and one decode step; the next is admitted in the step after.
    assert stats.num_forward_steps == 200
    # Loop passes: one per step, plus wake-ups for arrivals while it was idle (at most one each).
    assert stats.num_steps <= 200 + 5
    assert stats.num_loop_iterations <= stats.num_steps + 100 + 5
    assert stats.num_admission_scans <= 2 * 100 + 5  # scans on arrival and release, not every step
    time.sleep(0.2)  # let the loop finish its last pass after the final publish
    idle = engine.stats().num_loop_iterations
    assert idle <= stats.num_loop_iterations + 2
    time.sleep(0.3)
    assert engine.stats().num_loop_iterations == idle  # idle: the loop sleeps, it does not spin
    finished_cleanly(engine)


def test_shutdown_drains_or_aborts_and_then_refuses(engines):
    long = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)
    for drain in (True, False):
        engine = make_engine()
        engines.append(engine)

        async def main(engine=engine, drain=drain):
            task = asyncio.create_task(collect(engine, "inflight", prompt(8, 1), GREEDY if drain else long))
            while engine.stats().num_running == 0:
                await asyncio.sleep(0.005)
            await asyncio.to_thread(engine.shutdown, drain, 10)
            _, events = await task
            _, refused = await collect(engine, "late", prompt(8, 2))
            return events, refused

        events, refused = asyncio.run(main())
        assert events[-1].reason.kind is (FinishKind.LENGTH if drain else FinishKind.ABORTED)
        assert [e.reason.code for e in refused] == [RejectCode.OVERLOADED]
        assert "shutting down" in refused[0].reason.message
        engine._core.check_integrity()


def test_a_failing_model_ends_every_stream_and_the_engine_refuses_new_work(engines, monkeypatch):
    engine = make_engine(max_concurrency=2)
    engines.append(engine)

    def broken(output):
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine._core.runner, "execute", broken)

    async def main():
        results = await asyncio.gather(collect(engine, "a", prompt(8, 1)), collect(engine, "b", prompt(9, 2)))
        _, later = await collect(engine, "c", prompt(8, 3))
        return results, later

    results, later = asyncio.run(main())
    for _, events in results:
        (event,) = events  # aborted if it reached the loop before the failure, else refused
        assert event.reason.kind in (FinishKind.ABORTED, FinishKind.REJECTED)
        assert "device lost" in event.reason.message
    assert "engine failed" in later[0].reason.message and isinstance(engine.error, RuntimeError)
