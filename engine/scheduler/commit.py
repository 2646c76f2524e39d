"""Committing one executed step, and ending lanes whose rows are still in flight (overlap scheduling).

Owns: `commit` (a `StepResult` applied to the lanes: computed positions, snapshot saves, sampled tokens
with the stop and length checks, host restore reports) and `release` (a lane's end). Scheduler-private:
it mutates the `Scheduler`'s lanes, pools and counters, as engine/scheduler/ondemand.py does.

Overlap scheduling (`--overlap`, engine/core.py): the engine may build plan N+1 before committing plan N.
The scheduler's bookkeeping is therefore done when a row is planned, not when it is committed:

    plan N    row of lane L: feeds ..t[n-1], samples t[n]  -> computed = n, num_pending_tokens = 1
    plan N+1  row of lane L: feeds PREVIOUS_TOKEN at n     -> computed = n+1 (t[n] still on the device)
    commit N  appends t[n] (stop / length checks)          -> num_pending_tokens back to 1 (plan N+1's)

A lane whose request ends at commit N (a stop token, a stop string, an abort) while its plan N+1 row is in
flight is `ending`: its `FinishEvent` goes out at once, the row's token is discarded when plan N+1 commits
(never emitted), and only then are its pages and slot freed (that row still writes them). When the
sequence is retained, its checkpoint then covers t[n] too: the wasted row computed exactly that token.
A length limit never wastes a row: a lane whose pending token reaches it gets no row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from engine.request import Event, FinishEvent, FinishReason, TokenEvent, TokenLogprob
from engine.scheduler.lane import Lane
from engine.scheduler.reasoning import reasoning_step
from engine.scheduler.spec import retains_exactly
from engine.step import StepPlan, StepResult

if TYPE_CHECKING:
    from engine.scheduler.scheduler import Scheduler


def commit(s: Scheduler, plan: StepPlan, result: StepResult) -> list[Event]:
    """`Scheduler.commit`: the host restores the runner reported, then each row in order."""
    assert s._outstanding and s._outstanding[0] == plan.step_id, (
        f"commit() of step {plan.step_id} without schedule() (outstanding: {list(s._outstanding)})"
    )
    result.check(plan)
    s._outstanding.popleft()
    events, s._outbox = s._outbox, []
    for report in result.host_reports:
        assert s.host is not None, "a host restore report without host parking"
        s.host.finished(report)  # the index: unpin and free, or drop the failed entry
        lane = s.lanes[report.lane]
        if lane is None or lane.request.request_id != report.request_id or not lane.restoring:
            continue  # released while its restore was in flight
        lane.restoring = False
        if not report.ok:
            s._restore_failed(lane)
    drafts = result.draft_token_ids or ((),) * len(plan.rows)
    logprobs = result.logprobs or (None,) * len(plan.rows)
    for row, tokens, rolled_back, row_logprobs, next_drafts, accepted in zip(plan.rows, result.sampled_token_ids,
            result.num_rolled_back, logprobs, drafts, result.num_accepted, strict=True):  # fmt: skip
        lane = s.lanes[row.lane]
        assert lane is not None and lane.request.request_id == row.request_id, f"lane {row.lane} changed"
        request = lane.request
        lane.num_inflight_rows -= 1
        lane.num_pending_tokens -= row.num_sample
        if lane.restore is not None:  # the runner has copied the snapshot: it may be evicted now
            s.prefix.unpin(lane.restore)  # type: ignore[union-attr]
            lane.restore = None
            s._admission_dirty = True
        if lane.num_inflight_rows == 0:  # a later row in flight has moved it on already
            request.num_computed_tokens = row.end_pos - rolled_back
        if row.save_state_to is not None:
            assert s.prefix is not None, "a snapshot save without prefix reuse"
            lane.pending_saves.remove((row.save_state_to, row.end_pos))
            s.prefix.insert(
                request.identity_ids, request.page_hashes, row.end_pos, lane.page_ids, row.save_state_to
            )
        if lane.ending is not None:  # ended while this row was in flight: its token is discarded
            if lane.num_inflight_rows == 0:
                s._free_lane(lane, retain=lane.ending)
            continue
        if row.num_sample > 1:
            s.spec_stats.verified(request, row.num_sample - 1, accepted)
        if tokens:
            lane.drafts = next_drafts
            commit_tokens(s, lane, tokens, events, row_logprobs, exact=retains_exactly(row))
    return events


def commit_tokens(
    s: Scheduler,
    lane: Lane,
    tokens: Sequence[int],
    events: list[Event],
    logprobs: Sequence[TokenLogprob] | None = None,
    *,
    exact: bool = True,
) -> None:
    """Append `tokens` to the lane's request in order, up to the first that finishes it. A verify row
    (not `exact`) cut short by a finish is not retained: its state sits past the last kept token."""
    request = lane.request
    if request.first_token_time is None:
        request.first_token_time = s.clock()
    committed: list[int] = []
    kept: list[TokenLogprob] = []
    reason = None
    for k, token in enumerate(tokens):
        appended = reasoning_step(s.reasoning_tokens, request, token)
        forced = appended != (token,)  # the reasoning's forced close: fed next, like a prompt's tail
        if forced:
            request.num_computed_tokens = min(request.num_computed_tokens, request.num_tokens)
        for appended_token in appended:
            request.token_ids.append(appended_token)
            committed.append(appended_token)
            if logprobs is not None:  # a forced token has probability 1
                kept.append(TokenLogprob(appended_token, 0.0) if forced else logprobs[k])
            reason = s._finish_reason(lane, appended_token)
            if reason is not None:
                break
        if reason is not None or forced:
            break  # later tokens of the row followed the replaced one
    logged = None if logprobs is None else tuple(kept)
    events.append(TokenEvent(request.request_id, tuple(committed), request.num_output_tokens, logged))
    if reason is not None:
        retain = exact or len(committed) == len(tokens)
        events.append(release(s, lane, reason, retain=retain))


def release(s: Scheduler, lane: Lane, reason: FinishReason, *, retain: bool) -> FinishEvent:
    """End the lane's request now. The lane itself is freed now, or, when rows of it are in flight, once
    the last of them is committed (it is `ending` meanwhile: no rows, its tokens discarded)."""
    if lane.num_inflight_rows:
        lane.ending = retain
        lane.drafts = ()
    else:
        s._free_lane(lane, retain=retain)
    return s._end(lane.request, reason)
