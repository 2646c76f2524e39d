"""Scheduler admission, token budget, finishing and aborts, driven by the fake runner.

The runner here is `scheduler_harness.FakeRunner`: the tests need no model, so they
execute the StepPlan protocol (engine/step.py) on plain lists and assert page/slot accounting
(`check_integrity()`) after every step.
"""

from __future__ import annotations

import pytest
from scheduler_harness import Driver, FakeRunner, make_scheduler, request

from engine.request import FinishKind, RejectCode, RequestStatus, TokenEvent
from engine.step import StepResult


def test_hundred_queued_requests_at_one_lane_all_finish_without_spinning() -> None:
    sched = make_scheduler(lanes=1, num_pages=8, max_pending=100, prefix_reuse=False)
    drv = Driver(sched)
    for i in range(100):
        assert drv.add(request(f"r{i}", [1 + i % 7, 2, 3, 4, 5], max_tokens=3)) is None
    drv.run()
    assert sorted(drv.finishes) == sorted(f"r{i}" for i in range(100))
    for i in range(100):
        assert drv.reason(f"r{i}").reason.kind is FinishKind.LENGTH
        assert len(drv.tokens[f"r{i}"]) == 3
    # One step per token: 1 prefill step (5 prompt tokens fit the 8-token chunk, sampling the 1st
    # output) + 2 decode steps per request, and no empty steps in between.
    assert drv.num_steps == 100 * 3
    # Admission scans run on arrivals and releases only (the scan after the 100 arrivals is one).
    assert sched.num_admission_scans <= 101
    assert sched.pages.num_free == sched.pages.num_pages


def test_admission_scan_is_not_rerun_on_decode_steps_while_the_head_is_blocked() -> None:
    sched = make_scheduler(lanes=2, num_pages=8, prefix_reuse=False)
    drv = Driver(sched)
    drv.add(request("long", [1] * 17, max_tokens=8))  # its prompt: 5 pages, growing to 6
    drv.step()
    drv.add(request("blocked", [2] * 16, max_tokens=2))  # its prompt needs 4 pages, 3 are free
    drv.step()
    scans = sched.num_admission_scans
    for _ in range(5):
        drv.step()
    assert sched.num_admission_scans == scans, "a failed scan was re-run on decode steps"
    assert sched.num_waiting == 1
    drv.add(request("third", [3] * 4, max_tokens=1))  # arrival: one more scan, head still blocked
    drv.step()
    assert sched.num_admission_scans == scans + 1 and sched.num_waiting == 2
    drv.run()
    assert all(drv.reason(r).reason.kind is FinishKind.LENGTH for r in ("long", "blocked", "third"))


def test_oldest_waiting_request_is_protected_from_younger_ones() -> None:
    sched = make_scheduler(lanes=2, num_pages=8, prefix_reuse=False)
    drv = Driver(sched)
    drv.add(request("a", [1] * 4, max_tokens=17))  # 5 pages
    drv.step()
    drv.add(request("big", [2] * 4, max_tokens=13))  # 4 pages: blocked (3 free)
    drv.add(request("small", [3] * 4, max_tokens=1))  # 1 page: would fit, must not jump the queue
    order = []
    while sched.has_work():
        for row in drv.step().rows:
            if row.request_id not in order:
                order.append(row.request_id)
    assert order == ["a", "big", "small"]


def test_single_token_budget_mixes_decode_rows_and_a_prefill_chunk() -> None:
    sched = make_scheduler(lanes=2, num_pages=16, max_context=64, prefill_chunk=8, prefix_reuse=False)
    drv = Driver(sched)
    drv.add(request("dec", [1, 2, 3], max_tokens=10))
    drv.step()  # dec: whole prompt, samples its first token
    drv.add(request("pre", list(range(1, 21)), max_tokens=2))
    out = drv.step()
    assert [(r.request_id, r.num_tokens, r.sample) for r in out.rows] == [
        ("dec", 1, True),
        ("pre", 8, False),
    ]
    assert out.rows[1].reset_state and not out.rows[0].reset_state
    out = drv.step()
    assert [(r.request_id, r.start_pos, r.num_tokens) for r in out.rows] == [("dec", 4, 1), ("pre", 8, 8)]
    out = drv.step()
    assert [(r.request_id, r.start_pos, r.num_tokens, r.sample) for r in out.rows] == [
        ("dec", 5, 1, True),
        ("pre", 16, 4, True),
    ]
    out = drv.step()  # both decode now: one token each, compacted in lane order
    assert [(r.lane, r.num_tokens) for r in out.rows] == [(0, 1), (1, 1)]
    drv.run()


def _alone(prompt: list[int], max_tokens: int) -> list[int]:
    drv = Driver(make_scheduler(num_pages=32, max_context=128, prefill_chunk=128, prefix_reuse=False))
    drv.add(request("r", prompt, max_tokens=max_tokens))
    drv.run()
    return drv.tokens["r"]


@pytest.mark.parametrize("decoding", [1, 4])
def test_a_step_with_decode_rows_prefills_at_most_prefill_chunk_decoding(decoding: int) -> None:
    """Two lanes decode for the whole of a 30-token prefill: every step carries decode rows, so the prefill
    advances `decoding` tokens a step (never stalls), then all three give their alone tokens."""
    sched = make_scheduler(
        lanes=3, num_pages=48, max_context=128, prefill_chunk=16, prefill_chunk_decoding=decoding,
        prefix_reuse=False,
    )  # fmt: skip
    drv = Driver(sched)
    prompts = {"d1": [1, 2, 3], "d2": [4, 5], "pre": list(range(1, 31))}
    drv.add(request("d1", prompts["d1"], max_tokens=40))
    drv.add(request("d2", prompts["d2"], max_tokens=40))
    drv.step()  # both prompts in one step, no decode rows yet
    drv.add(request("pre", prompts["pre"], max_tokens=3))
    chunks = []
    while "pre" not in drv.tokens:
        out = drv.step()
        assert [(r.request_id, r.num_tokens) for r in out.rows[:2]] == [("d1", 1), ("d2", 1)]
        chunks += [r.num_tokens for r in out.rows if r.request_id == "pre"]
    assert chunks == [decoding] * (30 // decoding) + ([30 % decoding] if 30 % decoding else [])
    drv.run()
    for rid, max_tokens in (("d1", 40), ("d2", 40), ("pre", 3)):
        assert drv.tokens[rid] == _alone(prompts[rid], max_tokens), rid


def test_without_decode_rows_a_prefill_uses_the_full_prefill_chunk() -> None:
    """Full chunks while nothing decodes, the smaller budget while a lane does, full again once it ends."""
    sched = make_scheduler(
        lanes=2, num_pages=48, max_context=128, prefill_chunk=16, prefill_chunk_decoding=4, prefix_reuse=False
    )
    drv = Driver(sched)
    drv.add(request("a", list(range(1, 41)), max_tokens=2))
    drv.add(request("b", list(range(2, 42)), max_tokens=2))
    steps = []
    while sched.has_work():
        out = drv.step()
        steps.append([(r.request_id, r.num_tokens) for r in out.rows])
    assert steps[:4] == [[("a", 16)], [("a", 16)], [("a", 8), ("b", 8)], [("a", 1), ("b", 4)]]
    # "a" finished at its second token: "b" is alone again and prefills at the full chunk.
    assert steps[4:] == [[("b", 16)], [("b", 12)], [("b", 1)]]
    assert drv.tokens["a"] == _alone(list(range(1, 41)), 2)
    assert drv.tokens["b"] == _alone(list(range(2, 42)), 2)


@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_chunked_prefill_gives_the_same_tokens_for_any_chunk_size(chunk: int) -> None:
    drv = Driver(make_scheduler(num_pages=16, max_context=64, prefill_chunk=chunk, prefix_reuse=False))
    drv.add(request("r", list(range(1, 18)), max_tokens=5))
    drv.run()
    ref = Driver(make_scheduler(num_pages=16, max_context=64, prefill_chunk=64, prefix_reuse=False))
    ref.add(request("r", list(range(1, 18)), max_tokens=5))
    ref.run()
    assert drv.tokens["r"] == ref.tokens["r"] and len(ref.tokens["r"]) == 5


def test_impossible_requests_are_refused_at_once_with_the_numbers() -> None:
    sched = make_scheduler(num_pages=8, page_size=4, max_context=64)
    drv = Driver(sched)
    event = drv.add(request("huge", [1] * 10, max_tokens=30))  # 39 positions = 10 pages > 8
    assert event is not None and event.reason.kind is FinishKind.REJECTED
    assert event.reason.code is RejectCode.TOO_LARGE
    for number in ("10 KV pages", "10 prompt", "30 output", "4 tokens per page", "8 pages"):
        assert number in event.reason.message
    event = drv.add(request("long", [1] * 64, max_tokens=1))
    assert event is not None and event.reason.code is RejectCode.CONTEXT_LENGTH
    assert "64 tokens" in event.reason.message and "max_context is 64" in event.reason.message
    assert sched.num_waiting == 0 and not sched.has_work()


def test_queue_full_is_refused_as_overload() -> None:
    sched = make_scheduler(lanes=1, max_pending=2)
    drv = Driver(sched)
    for rid in "abc":  # lanes + pending places = 3 live requests
        assert drv.add(request(rid, [1, 2], max_tokens=2)) is None
    event = drv.add(request("d", [1, 2]))
    assert event is not None and event.reason.code is RejectCode.OVERLOADED
    assert "0 running + 3 waiting requests = 1 lanes + 2 pending places" in event.reason.message
    drv.step()  # admits "a": still 3 live requests
    assert drv.add(request("e", [1, 2])).reason.code is RejectCode.OVERLOADED
    drv.step()  # "a" finishes: room for one more
    assert drv.add(request("f", [1, 2])) is None
    drv.run()
    assert {r: drv.reason(r).reason.kind for r in "abcf"} == dict.fromkeys("abcf", FinishKind.LENGTH)
    assert {r: drv.reason(r).reason.kind for r in "de"} == dict.fromkeys("de", FinishKind.REJECTED)


def test_pending_timeout_rejects_a_request_that_waits_too_long() -> None:
    now = [0.0]
    sched = make_scheduler(lanes=1, timeout_ms=1000, clock=lambda: now[0])
    drv = Driver(sched)
    drv.add(request("running", [1, 2], max_tokens=20, arrival=0.0))
    drv.step()
    drv.add(request("late", [3, 4], arrival=0.5))
    now[0] = 1.4
    drv.step()
    assert "late" not in drv.finishes
    scans = sched.num_admission_scans
    now[0] = 1.6
    drv.step()
    event = drv.reason("late")
    assert event.reason.code is RejectCode.QUEUE_TIMEOUT and "1100 ms" in event.reason.message
    assert sched.num_waiting == 0 and sched.num_admission_scans == scans + 1
    drv.run()
    assert drv.reason("running").reason.kind is FinishKind.LENGTH


def test_finish_reasons_stop_length_context_and_ignore_eos() -> None:
    eos = 5

    def script(context: tuple[int, ...]) -> int:
        return eos if len(context) == 6 else 50  # the 3rd output token of a 4-token prompt is EOS

    sched = make_scheduler(lanes=4, num_pages=32, max_context=12, eos=(eos,))
    drv = Driver(sched, FakeRunner(sched, script))
    drv.add(request("eos", [1, 2, 3, 4], max_tokens=8))
    drv.add(request("ignore", [1, 2, 3, 6], max_tokens=4, ignore_eos=True))
    drv.add(request("stop_id", [1, 2, 3, 7], max_tokens=8, stop_token_ids=(50,)))
    drv.add(request("context", [1, 2, 3, 8], max_tokens=100, ignore_eos=True))
    drv.run()
    assert drv.reason("eos").reason.kind is FinishKind.STOP and drv.reason("eos").reason.stop_match == eos
    assert drv.tokens["eos"] == [50, 50, eos]
    assert drv.reason("ignore").reason.kind is FinishKind.LENGTH and drv.tokens["ignore"] == [50, 50, eos, 50]
    assert drv.reason("stop_id").reason.stop_match == 50 and drv.tokens["stop_id"] == [50]
    ctx = drv.reason("context")
    assert ctx.reason.kind is FinishKind.CONTEXT and ctx.num_prompt_tokens + ctx.num_output_tokens == 12


def test_stop_request_ends_a_running_request_as_stop_and_retains_it() -> None:
    sched = make_scheduler(lanes=1)
    drv = Driver(sched)
    drv.add(request("r", [1, 2, 3], max_tokens=10))
    drv.step()
    drv.step()
    drv.record(sched.stop_request("r", "</answer>"))
    sched.check_integrity()
    event = drv.reason("r")
    assert event.reason.kind is FinishKind.STOP and event.reason.stop_match == "</answer>"
    assert event.num_output_tokens == 2 and sched.num_running == 0
    assert [cp.num_tokens for cp in sched.prefix.checkpoints] == [4]  # prompt + the fed output token
    assert sched.stop_request("r", "x") is None


def _abort_scenario(abort_at: int | None, victim: str) -> Driver:
    """Three requests on two lanes; `victim` is aborted before step `abort_at` (None: never)."""
    sched = make_scheduler(lanes=2, num_pages=12, max_context=40, prefill_chunk=4)
    drv = Driver(sched)
    drv.add(request("a", [1, 2, 3, 4, 5, 6], max_tokens=4, boundaries=(4,)))
    drv.add(request("b", [1, 2, 3, 4, 9, 9, 9], max_tokens=3))
    drv.add(request("c", [7, 7, 7], max_tokens=5))
    step = 0
    while sched.has_work():
        if step == abort_at:
            event = sched.abort(victim, "client went away")
            drv.record(event)
            sched.check_integrity()
        drv.step()
        step += 1
    return drv


@pytest.mark.parametrize("victim", ["a", "b", "c"])
def test_abort_at_every_point_frees_everything_and_the_others_continue(victim: str) -> None:
    ref = _abort_scenario(None, victim)
    for abort_at in range(ref.num_steps + 1):
        drv = _abort_scenario(abort_at, victim)
        sched = drv.scheduler
        for rid in "abc":
            assert len(drv.finishes[rid]) == 1, f"{rid}: {len(drv.finishes[rid])} terminal events"
        kind = drv.reason(victim).reason.kind
        if kind is FinishKind.ABORTED:
            assert drv.reason(victim).reason.message == "client went away"
            assert drv.tokens.get(victim, []) == ref.tokens[victim][: len(drv.tokens.get(victim, []))]
        else:  # aborted after it had already finished: the abort was a no-op
            assert kind is FinishKind.LENGTH and drv.tokens[victim] == ref.tokens[victim]
        for other in set("abc") - {victim}:
            assert drv.tokens[other] == ref.tokens[other], (
                f"{other} changed after aborting {victim}@{abort_at}"
            )
        assert sched.num_running == 0 and sched.num_waiting == 0
        sched.prefix.clear()
        sched.check_integrity()
        assert sched.pages.num_free == sched.pages.num_pages
        assert sched.slots.num_free == sched.slots.num_slots


def test_abort_of_a_waiting_request_and_of_an_unknown_id() -> None:
    sched = make_scheduler(lanes=1)
    drv = Driver(sched)
    drv.add(request("a", [1, 2], max_tokens=5))
    req = request("b", [3, 4])
    drv.add(req)
    drv.step()
    drv.record(sched.abort("b"))
    assert drv.reason("b").reason.kind is FinishKind.ABORTED and req.status is RequestStatus.FINISHED
    assert sched.abort("b") is None and sched.abort("nobody") is None
    drv.run()
    assert drv.reason("a").reason.kind is FinishKind.LENGTH


def test_commit_checks_the_number_of_sampled_tokens_and_step_order() -> None:
    sched = make_scheduler()
    sched.add_request(request("a", [1, 2]))
    out = sched.schedule()
    with pytest.raises(AssertionError, match="schedule\\(\\) twice"):
        sched.schedule()
    with pytest.raises(ValueError, match="has 0 token lists, 0 accepted and 0 rolled-back counts for 1 rows"):
        sched.commit(out, StepResult((), (), ()))
    with pytest.raises(ValueError, match="0 tokens back for num_sample=1"):
        sched.commit(out, StepResult(((),), (0,), (0,)))
    with pytest.raises(AssertionError, match="step boundary"):
        sched.abort("a")
    sched.commit(out, StepResult.of_sampled(out, [[11]]))
    with pytest.raises(ValueError, match="already queued or running"):
        sched.add_request(request("a", [1, 2]))


def test_stats_count_tokens_pages_and_requests() -> None:
    sched = make_scheduler(lanes=2, num_pages=16, max_context=40)
    drv = Driver(sched)
    drv.add(request("a", [1] * 6, max_tokens=3))
    drv.add(request("b", [2] * 5, max_tokens=2))
    drv.step()
    stats = sched.stats()
    assert (stats.num_running, stats.num_waiting, stats.num_prefill_tokens, stats.num_decode_tokens) == (
        2,
        0,
        8,
        0,
    )
    assert stats.num_pages_used == 2 + 2  # a: 8 positions, b: 6 positions, 4 tokens per page
    drv.run()
    stats = sched.stats()
    assert (stats.num_prefill_tokens, stats.num_decode_tokens) == (11, 3)  # b's 3 remaining prompt tokens
    assert stats.num_running == 0 and stats.num_checkpoints == 2


def test_finish_events_carry_queue_and_prefill_seconds() -> None:
    """Queue = arrival to admission (to the end when never admitted); prefill = admission to first token."""
    now = [0.0]
    sched = make_scheduler(lanes=1, timeout_ms=1000, prefill_chunk=4, clock=lambda: now[0])
    drv = Driver(sched)
    drv.add(request("a", list(range(1, 11)), max_tokens=3, arrival=0.0))
    drv.add(request("b", [1, 2], max_tokens=2, arrival=0.4))
    drv.add(request("late", [3, 4], arrival=0.2))
    now[0] = 0.5
    drv.step()  # admits "a", first chunk of its 10-token prompt
    for t in (0.75, 1.0):  # two more chunks; the third samples its first token
        now[0] = t
        drv.step()
    now[0] = 1.25
    drv.step()  # "late" has waited 1.05 s: refused
    drv.run()  # "a" finishes at 1.25; "b" is admitted and prefilled in the next step, at 1.25 too
    a, b, late = drv.reason("a"), drv.reason("b"), drv.reason("late")
    assert (a.queue_seconds, a.prefill_seconds) == (0.5, 0.5)
    assert b.reason.kind is FinishKind.LENGTH
    assert b.queue_seconds == pytest.approx(1.25 - 0.4) and b.prefill_seconds == 0.0
    assert late.reason.code is RejectCode.QUEUE_TIMEOUT
    assert late.queue_seconds == pytest.approx(1.25 - 0.2) and late.prefill_seconds is None


def _decode_step(eos: tuple[int, ...] = (), max_tokens: int = 6, stop_token_ids: tuple[int, ...] = ()):
    """A scheduler with request "a" ([1, 2, 3], prefilled, first token 50 committed) and its decode plan."""
    sched = make_scheduler(eos=eos)
    sched.add_request(request("a", [1, 2, 3], max_tokens=max_tokens, stop_token_ids=list(stop_token_ids)))
    sched.commit(prefill := sched.schedule(), StepResult.of_sampled(prefill, [[50]]))
    plan = sched.schedule()
    assert [(r.request_id, r.num_tokens, r.num_sample) for r in plan.rows] == [("a", 1, 1)]
    return sched, plan


def test_commit_takes_a_list_of_tokens_per_row_and_stops_at_the_first_that_ends_it() -> None:
    """The step contract carries several tokens per row (speculative decoding): each is committed with
    the same stop and length checks, and tokens after the one that ends the request are dropped."""
    sched, plan = _decode_step(eos=(7,))
    events = sched.commit(plan, StepResult.of_sampled(plan, [[60, 7, 61]]))
    assert [e.token_ids for e in events if isinstance(e, TokenEvent)] == [(60, 7)]
    (finish,) = [e for e in events if not isinstance(e, TokenEvent)]
    assert finish.reason.kind is FinishKind.STOP and finish.num_output_tokens == 3
    sched.check_integrity()

    sched, plan = _decode_step(max_tokens=3)  # 50 + two more reach max_tokens
    events = sched.commit(plan, StepResult.of_sampled(plan, [[60, 61, 62, 63]]))
    assert [e.token_ids for e in events if isinstance(e, TokenEvent)] == [(60, 61)]
    assert events[-1].reason.kind is FinishKind.LENGTH  # type: ignore[union-attr]

    sched, plan = _decode_step(stop_token_ids=(61,))
    events = sched.commit(plan, StepResult.of_sampled(plan, [[61, 62]]))
    assert [e.token_ids for e in events if isinstance(e, TokenEvent)] == [(61,)]
    assert events[-1].reason.kind is FinishKind.STOP  # type: ignore[union-attr]


def test_commit_of_several_tokens_leaves_the_uncomputed_ones_to_feed_next() -> None:
    """Three tokens committed from a one-position row: they are known but not computed, so the next step
    feeds all three as one row (the "catch up" model) and samples after the last."""
    sched, plan = _decode_step(max_tokens=10)
    sched.commit(plan, StepResult.of_sampled(plan, [[60, 61, 62]]))
    request_a = sched.requests["a"]
    assert request_a.token_ids == [1, 2, 3, 50, 60, 61, 62] and request_a.num_computed_tokens == 4
    nxt = sched.schedule()
    assert [(r.token_ids, r.start_pos, r.num_sample) for r in nxt.rows] == [((60, 61, 62), 4, 1)]
    sched.commit(nxt, StepResult.of_sampled(nxt, [[63]]))
    assert request_a.num_computed_tokens == 7 and request_a.token_ids[-1] == 63
    sched.check_integrity()


def test_rolled_back_positions_are_not_computed() -> None:
    sched = make_scheduler()
    sched.add_request(request("a", [1, 2, 3, 4, 5], max_tokens=4))
    plan = sched.schedule()
    (row,) = plan.rows
    result = StepResult(((70,),), (0,), (2,))  # the last 2 fed positions are rolled back
    sched.commit(plan, result)
    assert sched.requests["a"].num_computed_tokens == row.end_pos - 2
    with pytest.raises(ValueError, match="5 of 5 fed positions rolled back"):
        StepResult(((70,),), (0,), (5,)).check(plan)
