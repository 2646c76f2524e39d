"""Executable accounting invariants of the scheduler (STYLE 2.6): run after every step in tests.

Recounts every page reference and state slot from their holders (lanes, checkpoints, in-flight
snapshot saves) and compares with the pools; raises RuntimeError with the numbers that disagree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.request import RequestStatus

if TYPE_CHECKING:
    from engine.scheduler.scheduler import Scheduler


def check_integrity(scheduler: Scheduler) -> None:
    """Prove page, slot and request accounting; RuntimeError with the disagreeing numbers."""
    scheduler.pages.check_integrity()
    checkpoints = scheduler.prefix.checkpoints if scheduler.prefix is not None else []
    if scheduler.prefix is not None:
        scheduler.prefix.check_integrity()
    if scheduler.host is not None:
        scheduler.host.check_integrity()
    expected = [0] * scheduler.pages.num_pages
    held_slots: list[int] = [cp.state_slot for cp in checkpoints]
    pins: dict[int, int] = {}
    running: set[str] = set()
    for lane in scheduler.lanes:
        if lane is None:
            continue
        request = lane.request
        ending = lane.ending is not None  # ended with a row in flight (overlap): freed when it commits
        if not ending:
            running.add(request.request_id)
        low = scheduler.pages.pages_for(request.num_computed_tokens)
        high = scheduler.pages.pages_for(lane.max_num_tokens - 1)
        status = RequestStatus.FINISHED if ending else RequestStatus.RUNNING
        if not low <= len(lane.page_ids) <= high or request.status is not status:
            raise RuntimeError(
                f"lane {lane.lane_id}: {len(lane.page_ids)} pages (want {low}..{high}), status {request.status}"
            )
        if len(set(lane.page_ids)) != len(lane.page_ids):
            raise RuntimeError(f"lane {lane.lane_id}: a page twice in its row {lane.page_ids}")
        # a row in flight may have fed the last token (or PREVIOUS_TOKEN, one past the committed ones)
        inflight = lane.num_inflight_rows > 0
        top = request.num_tokens + (1 if inflight else 0)
        if not 0 <= request.num_computed_tokens < top or not request.num_tokens < lane.max_num_tokens + 1:
            raise RuntimeError(
                f"lane {lane.lane_id}: computed {request.num_computed_tokens}, tokens {request.num_tokens}, "
                f"limit {lane.max_num_tokens}"
            )
        for page_id in lane.page_ids:
            expected[page_id] += 1
        held_slots.append(lane.state_slot)
        held_slots.extend(slot for slot, _ in lane.pending_saves)
        if lane.restore is not None:
            pins[lane.restore.checkpoint_id] = pins.get(lane.restore.checkpoint_id, 0) + 1
    for cp in checkpoints:
        for page_id in cp.page_ids:
            expected[page_id] += 1
        if cp.num_pins != pins.get(cp.checkpoint_id, 0):
            raise RuntimeError(
                f"checkpoint {cp.checkpoint_id}: {cp.num_pins} pins, {pins.get(cp.checkpoint_id, 0)} lanes"
            )
    wrong = [
        (p, expected[p], scheduler.pages.ref_count(p))
        for p in range(scheduler.pages.num_pages)
        if expected[p] != scheduler.pages.ref_count(p)
    ]
    if wrong:
        raise RuntimeError(f"page ref counts disagree with holders (page, holders, ref_count): {wrong[:8]}")
    scheduler.slots.check_integrity(held_slots)
    waiting = {r.request_id for r in scheduler.waiting}
    if any(r.status is not RequestStatus.WAITING or r.num_computed_tokens for r in scheduler.waiting):
        raise RuntimeError("a queued request is not WAITING or holds computed tokens")
    if waiting & running or waiting | running != set(scheduler.requests):
        raise RuntimeError(
            f"{len(waiting)} waiting + {len(running)} running != {len(scheduler.requests)} known requests"
        )
