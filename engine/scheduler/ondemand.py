"""Pages on demand: growing a lane's page-table row as it decodes, and preempting lanes when the pool is short.

Owns: the grow-then-preempt policy (scheduler-private; it mutates the `Scheduler`'s lanes, pools and
queue, as the scheduler module does). A lane is admitted with the pages of its known tokens; each step,
before rows are built, every runnable lane (oldest admitted first) gets the pages its next row writes.
When the free pages run out:

    1. reclaim unpinned prefix checkpoints (LRU; parked to host RAM when host parking is on)
    2. preempt the newest admitted lane (vLLM's order; it may be the growing lane itself): its computed
       tokens become a checkpoint with its state slot, its pages and lane are freed, and its request
       goes back to the head of the queue, WAITING, with every token it has (prompt + output so far)
    3. repeat until the lane fits; the oldest lane always fits (a request that cannot run alone in an
       empty pool is refused at `add_request`)

Resume is an ordinary admission of the longer sequence: a prefix match of its own checkpoint (device,
or host-parked) restores the KV and the exact GDN state; else it recomputes prompt + output from zero
(the state is rebuilt from the same tokens). The last known token's row samples the next token, so a
greedy output is unchanged. The runner keeps the request's sampler state across the preemption (its
id is not released), and usage keeps the first admission's cached-token counts. `num_preemptions` counts
preemptions, `num_recomputed_tokens` the tokens computed before a preemption that its resume computed again.

Overlap scheduling: a lane with a row in flight is never preempted (its pages are still written). Before
planning ahead the engine asks `fits_without_preempting`; when it says no, the plan in flight is committed
first, and this step grows (and preempts) on committed state as above.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.request import RequestStatus
from engine.scheduler.lane import Lane

if TYPE_CHECKING:
    from engine.scheduler.scheduler import Scheduler


def grow(s: Scheduler) -> list[Lane]:
    """Give every runnable lane the pages its next row writes, oldest first, preempting the newest
    lanes when the pool runs short. Returns the lanes that could not grow (they skip this step)."""
    starved: list[Lane] = []
    for lane in sorted((x for x in s.lanes if x is not None), key=lambda x: x.admitted_seq):
        if s.lanes[lane.lane_id] is not lane or lane.restoring or lane.ending is not None:
            continue  # preempted earlier in this loop, waiting for its host restore, or ended
        # a speculative row also writes its drafts' positions (num_drafts caps them below max_num_tokens)
        if not ensure_pages(s, lane, lane.num_known_tokens + s.num_draft_tokens):
            starved.append(lane)
    return starved


def fits_without_preempting(s: Scheduler) -> bool:
    """Whether `grow` can map every lane's next row from free pages and reclaimed checkpoints alone."""
    need = 0
    for lane in s.lanes:
        if lane is None or lane.restoring or lane.ending is not None:
            continue
        positions = min(lane.num_known_tokens + s.num_draft_tokens, lane.max_num_tokens - 1)
        need += max(0, s.pages.pages_for(positions) - len(lane.page_ids))
    return need == 0 or s._reclaim(need)


def ensure_pages(s: Scheduler, lane: Lane, num_positions: int) -> bool:
    """Map pages for positions [0, num_positions) of `lane` (capped at its last fed position),
    reclaiming checkpoints and then preempting newer lanes if needed. False when only `lane` itself
    (or lanes that cannot be preempted) remain: `lane` is then preempted unless it is alone."""
    want = s.pages.pages_for(min(num_positions, lane.max_num_tokens - 1))
    while len(lane.page_ids) < want:
        missing = want - len(lane.page_ids)
        if s._reclaim(missing):
            lane.page_ids = lane.page_ids + tuple(s.pages.allocate(missing))
            return True
        victims = [x for x in s.lanes if x is not None and _preemptible(x)]
        victim = max(victims, key=lambda x: x.admitted_seq, default=None)
        if victim is None or (victim is lane and len(victims) == 1):
            return False  # a lone lane always fits: add_request refuses what an empty pool cannot hold
        preempt(s, victim)
        if victim is lane:
            return False
    return True


def preempt(s: Scheduler, lane: Lane) -> None:
    """Free `lane` and queue its request at the head of the queue to resume later with all its tokens.

    Its computed tokens become a prefix checkpoint (with its state slot), so the resume restores
    them when they survive (on the device, or parked on the host), else recomputes them."""
    assert _preemptible(lane), f"preempting lane {lane.lane_id} mid-copy or with rows in flight"
    request = lane.request
    s.lanes[lane.lane_id] = None
    if lane.restore is not None:
        s.prefix.unpin(lane.restore)  # type: ignore[union-attr]
    num_done = request.num_computed_tokens
    # A lane whose first row has not run holds neither its copy-on-write page nor its restored state yet.
    written = lane.initialized or lane.host_restored
    if s.prefix is not None and num_done >= 1 and written and not request.splits_media(num_done):
        s.prefix.insert(request.identity_ids, request.page_hashes, num_done, lane.page_ids, lane.state_slot)
    else:
        s.slots.free(lane.state_slot)
    s.pages.free(lane.page_ids)
    if request.request_id not in s._resumed:
        first = (request.num_cached_tokens, request.num_host_cached_tokens, request.admitted_time, num_done)
        s._resumed[request.request_id] = first
    else:  # preempted again: count what this admission computed too
        cached, host, admitted, _ = s._resumed[request.request_id]
        s._resumed[request.request_id] = (cached, host, admitted, num_done)
    request.status = RequestStatus.WAITING
    request.num_computed_tokens = 0
    s.waiting.appendleft(request)
    s.num_preemptions += 1
    s._admission_dirty = True


def _preemptible(lane: Lane) -> bool:
    """No copy or row of the lane in flight (a host restore, a snapshot save, an overlapped step)."""
    return (
        not lane.restoring and not lane.pending_saves and not lane.num_inflight_rows and lane.ending is None
    )
