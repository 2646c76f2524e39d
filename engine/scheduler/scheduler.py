"""Scheduler: admission, lanes, the per-step token budget, and committing sampled tokens.

Owns: the pending queue, the `max_concurrency` lanes, and (through engine.cache) every page, state
slot and checkpoint reference. It is the only mutator of `Request` state. Must not touch tensors,
the model or the tokenizer; its output is plain data (`StepPlan`, engine/step.py) and it reads back
plain data (`StepResult`).

One step is `schedule()` -> runner -> `commit()`. There is no prefill phase and no decode phase: each
running request has `num_computed_tokens` and `num_tokens`, and the step hands out one token budget:

    budget = one token per decode-ready lane + prefill budget
    prefill budget = prefill_chunk_decoding   if the step carries a decode row (default min(chunk, 2048))
                     prefill_chunk            otherwise (a lone prefill runs at full chunks)

    request A (decoding)  |============ computed ============|x|          x = 1 token (decode row)
    request B (prefill)   |== reused ==|== computed ==|-- chunk --|......|  chunk <= what is left of
                                                      ^ start_pos          the prefill budget,
                                                                           cut at message boundaries

The smaller budget while a lane decodes bounds that lane's inter-token latency: its token waits for the
whole step, prefill included (an 8,192-token chunk at 100k context took 0.7-0.8 s on the H200 at the 27B
geometry). It is >= 1, so a prefill always advances; the step never exceeds `max_num_batched_tokens`.

Admission (strict FCFS, the oldest waiting request is protected: nothing younger is admitted while it
is blocked) reserves a lane, a state slot and the pages of the known tokens (the prompt; for a resumed
request, prompt + output so far), beside any reused prefix pages. A lane then grows page by page as it
decodes (`_grow`, at the start of each step, oldest lane first; its page-table row only ever gains
pages at the end). When the pool runs short, unpinned checkpoints are reclaimed first, then the newest
admitted lane is preempted (vLLM's order): its computed tokens become a prefix checkpoint (parked to
host RAM when host parking is on and the pages are reclaimed) and it goes back to the head of the
queue with every token it has; resuming recomputes (or restores) them and samples the next token, so
its output is unchanged. A request that could not finish even alone in an empty pool is refused at
`add_request` with the numbers. A blocked admission scan is not retried every step: only after an
arrival, a release (finish / abort / unpin / preemption) or a queue timeout.

Thinking budget (`SamplingParams.thinking_budget`, given the tokenizer's `ReasoningTokens`): `commit` counts
a request's reasoning tokens, and once the budget is spent inside the reasoning it appends the template's
closing `\n</think>\n\n` instead of the sampled token. Those tokens are then fed like any others (a short
row, as a prefill chunk is), so the model writes its answer after a closed reasoning; nothing below the
scheduler knows. They count as output and are cut to the request's length limit.

Host parking (`attach_host`, engine/scheduler/host.py): evicted checkpoints are parked in host RAM,
and a request whose prompt matches a parked entry better than any device checkpoint restores it
into its own pages and working slot at admission, then prefills only the rest. The lane is not
runnable until the runner reports the restore's copies complete (`StepResult.host_reports`); a
failed restore (corrupt or mismatched entry) makes it prefill cold instead.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from engine.cache.host import HostIndex, HostMatch
from engine.cache.pages import PagePool
from engine.cache.prefix import PrefixIndex, PrefixMatch, extend_page_hashes
from engine.cache.state import StateSlotPool
from engine.config import CacheConfig, SchedulerConfig
from engine.request import (
    Event,
    FinishEvent,
    FinishKind,
    FinishReason,
    ReasoningTokens,
    RejectCode,
    Request,
    RequestStatus,
)
from engine.scheduler import commit as committing
from engine.scheduler import limits, ondemand
from engine.scheduler.host import HostPlanner
from engine.scheduler.integrity import check_integrity
from engine.scheduler.lane import Lane
from engine.scheduler.spec import SpecCounters, num_drafts, spec_cow_match
from engine.scheduler.stats import SchedulerStats
from engine.step import PREVIOUS_TOKEN, RowPlan, StepPlan, StepResult


class Scheduler:
    """Use: `add_request` / `abort` / `stop_request` at step boundaries; each step
    `plan = schedule()`, the runner executes `plan`, then `events = commit(plan, result)` (always
    called, even for an empty `plan`). `check_integrity()` proves the accounting.

    With `overlap`, one plan may be in flight (scheduled, not committed) when the next is scheduled, and
    `abort` / `stop_request` may come while it is (engine/scheduler/commit.py says how rows in flight end).
    """

    def __init__(
        self,
        config: SchedulerConfig,
        cache_config: CacheConfig,
        *,
        num_pages: int,
        eos_token_ids: Iterable[int] = (),
        reasoning_tokens: ReasoningTokens | None = None,
        clock: Callable[[], float] = time.monotonic,
        num_draft_tokens: int = 0,  # > 0: speculative decoding (engine/scheduler/spec.py: rows carry drafts)
        overlap: bool = False,  # a plan may be scheduled while the previous one is in flight
    ) -> None:
        self.config = config
        self.overlap = overlap
        self.num_draft_tokens = num_draft_tokens
        self.spec_stats = SpecCounters(num_draft_tokens)
        self.reasoning_tokens = reasoning_tokens  # None: thinking budgets are not enforced
        self.cache_config = cache_config
        self.eos_token_ids = frozenset(eos_token_ids)
        self.clock = clock
        self.pages = PagePool(num_pages, cache_config.page_size)
        num_checkpoints = cache_config.max_checkpoints if cache_config.prefix_reuse else 0
        self.slots = StateSlotPool(self.num_state_slots(config, cache_config))
        self.prefix = (
            PrefixIndex(self.pages, self.slots, num_checkpoints) if cache_config.prefix_reuse else None
        )
        self.lanes: list[Lane | None] = [None] * config.max_concurrency
        self.waiting: deque[Request] = deque()
        self.requests: dict[str, Request] = {}  # waiting and running, by id (read-only outside)
        self._outbox: list[Event] = []  # terminal events produced inside schedule()
        self._released: list[str] = []
        self._admission_dirty = False
        self._outstanding: deque[int] = deque()  # step ids scheduled and not yet committed
        self._step_id = 0
        self._admitted_seq = 0
        self.num_admission_scans = 0
        self.num_prefix_hits = 0
        self.num_prefix_hit_tokens = 0
        self.num_prefill_tokens = 0
        self.num_decode_tokens = 0
        # Steps that computed prompt tokens, and of those the ones that also carried rows computing none (a
        # prefill beside decoding lanes: their tokens wait for it). A burst admitted together is one prefill step.
        self.num_prefill_steps = 0
        self.num_mixed_steps = 0
        self._step_rows = [0, 0]  # this schedule(): rows computing prompt tokens, rows computing none
        self.host: HostPlanner | None = None
        # Preempted requests waiting to resume: id -> (cached tokens, host-cached tokens, admitted time)
        # of their first admission, which is what their usage reports, and the tokens computed when preempted.
        self._resumed: dict[str, tuple[int, int, float | None, int]] = {}
        self.num_preemptions = 0
        self.num_recomputed_tokens = 0  # of those computed tokens, the ones resumes computed again

    @staticmethod
    def num_state_slots(config: SchedulerConfig, cache_config: CacheConfig) -> int:
        """GDN state slots the scheduler hands out: one working slot per lane, one per checkpoint."""
        return config.max_concurrency + (cache_config.max_checkpoints if cache_config.prefix_reuse else 0)

    def attach_host(self, host: HostIndex) -> None:
        """Park evicted checkpoints in `host` and restore from it at admission (needs prefix reuse)."""
        if self.prefix is None:
            raise ValueError("host parking needs prefix reuse: nothing parked could ever be restored")
        assert self.host is None and len(self.prefix) == 0, "attach_host before the first request"
        self.host = HostPlanner(host, self.prefix)

    # ---- requests in ----------------------------------------------------------------------------

    def add_request(self, request: Request) -> FinishEvent | None:
        """Queue `request`, or refuse it at once: returns its terminal rejection event, else None."""
        if request.request_id in self.requests:
            raise ValueError(f"request_id={request.request_id!r}: already queued or running")
        assert request.status is RequestStatus.WAITING and request.num_computed_tokens == 0
        rejection = self._rejection(request)
        if rejection is not None:
            return self._end(request, rejection)
        request.in_reasoning = self._opens_reasoning(request.prompt_token_ids)
        self.waiting.append(request)
        self.requests[request.request_id] = request
        self._admission_dirty = True
        return None

    def _rejection(self, request: Request) -> FinishReason | None:
        return limits.rejection(self, request)

    def _opens_reasoning(self, prompt_token_ids: Sequence[int]) -> bool:
        """The prompt's last reasoning marker is `<think>`: generation starts inside the reasoning."""
        markers = self.reasoning_tokens
        if markers is None:
            return False
        for token in reversed(prompt_token_ids):
            if token == markers.start_id or token == markers.end_id:
                return token == markers.start_id
        return False

    def _limit(self, request: Request) -> tuple[int, FinishKind]:
        """The sequence length at which `request` must stop, and which limit that is."""
        return limits.output_limit(self.config, request)

    def abort(self, request_id: str, message: str = "") -> FinishEvent | None:
        """End a waiting or running request now, freeing its lane, pages and slot. None if unknown."""
        return self._end_by_id(request_id, FinishReason.aborted(message), retain=False)

    def stop_request(self, request_id: str, match: str) -> FinishEvent | None:
        """Finish a request whose detokenized text hit stop string `match` (found above the engine)."""
        return self._end_by_id(request_id, FinishReason.stop(match), retain=True)

    def _end_by_id(self, request_id: str, reason: FinishReason, *, retain: bool) -> FinishEvent | None:
        assert self.overlap or not self._outstanding, (
            "abort/stop between schedule() and commit(): call at a step boundary"
        )
        request = self.requests.get(request_id)
        if request is None:
            return None
        if request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
            self._admission_dirty = True
            if self._resumed.pop(request_id, None) is not None:
                self._released.append(request_id)  # preempted: the runner still holds its sampler state
            return self._end(request, reason)
        lane = next(lane for lane in self.lanes if lane is not None and lane.request is request)
        return committing.release(self, lane, reason, retain=retain)

    # ---- schedule -------------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        assert len(self._outstanding) < (2 if self.overlap else 1), "schedule() twice without commit()"
        self._step_id += 1
        self._outstanding.append(self._step_id)
        self._expire_waiting()
        starved = ondemand.grow(self)
        if self._admission_dirty:
            self._admit()
        rows: list[RowPlan] = []
        copies: list[tuple[int, int]] = []
        running = [
            lane for lane in self.lanes if lane is not None and lane not in starved and _runnable(lane)
        ]
        decoding = [lane for lane in running if lane.num_known_tokens - lane.request.num_computed_tokens == 1]
        self._step_rows = [0, 0]  # rows computing prompt tokens, rows computing none (decode rows)
        for lane in decoding:  # decode-ready first, compacted in lane order
            rows.append(self._decode_row(lane, copies))
        # A step with decode rows bounds their latency: its prefill gets the smaller (>= 1) budget.
        budget = self.config.effective_prefill_chunk_decoding if rows else self.config.prefill_chunk
        for lane in sorted(running, key=lambda lane: lane.admitted_seq):
            request = lane.request
            remaining = lane.num_known_tokens - request.num_computed_tokens
            if lane in decoding or budget == 0:
                continue
            n = min(remaining, budget)
            if lane.boundaries:
                n = min(n, lane.boundaries[0] - request.num_computed_tokens)
            rows.append(self._row(lane, n, copies))
            budget -= n
        prefill_rows, other_rows = self._step_rows
        if prefill_rows:
            self.num_prefill_steps += 1
            self.num_mixed_steps += int(other_rows > 0)
        released, self._released = tuple(self._released), []
        parks, unparks = self.host.take() if self.host is not None else ((), ())
        return StepPlan(self._step_id, tuple(rows), tuple(copies), released, parks, unparks)

    def _expire_waiting(self) -> None:
        now = self.clock()
        timeout_s = self.config.pending_timeout_ms / 1000.0
        expired = [
            r for r in self.waiting if now - r.arrival_time >= timeout_s and r.request_id not in self._resumed
        ]
        for request in expired:
            self.waiting.remove(request)
            waited_ms = (now - request.arrival_time) * 1000.0
            reason = FinishReason.rejected(
                RejectCode.QUEUE_TIMEOUT,
                f"waited {waited_ms:.0f} ms for a lane; pending timeout is {self.config.pending_timeout_ms} ms",
            )
            self._outbox.append(self._end(request, reason))
            self._admission_dirty = True

    # ---- pages on demand (engine/scheduler/ondemand.py) ------------------------------------------

    def ensure_pages(self, lane: Lane, num_positions: int) -> bool:
        """Map pages for positions [0, num_positions) of `lane`, preempting newer lanes if the pool is
        short; False if `lane` cannot run this step (it was preempted, or waits for a host restore)."""
        return ondemand.ensure_pages(self, lane, num_positions)

    def can_plan_ahead(self) -> bool:
        """Whether the next `schedule()` can run with the current plan in flight: every lane's next row fits
        in free (or reclaimable) pages, so no lane with a row in flight must be preempted. False: commit the
        plan in flight first (the engine's synchronous step)."""
        return ondemand.fits_without_preempting(self)

    def _admit(self) -> None:
        """Admit waiting requests in arrival order until the oldest one does not fit."""
        self._admission_dirty = False
        self.num_admission_scans += 1
        while self.waiting:
            lane_id = next((i for i, lane in enumerate(self.lanes) if lane is None), None)
            if lane_id is None or not self._try_admit(self.waiting[0], lane_id):
                return
            self.waiting.popleft()

    def _try_admit(self, request: Request, lane_id: int) -> bool:
        match = self._lookup(request)
        host_match = self._host_lookup(request, match)
        if host_match is None:
            return self._try_admit_matched(request, lane_id, match, None)
        assert self.host is not None
        # NOTE: held while admission reclaims pages and slots: the parks that may cause are decided at once
        # (HostIndex.add) and must not evict the entry this request is about to restore.
        self.host.hold(host_match)
        try:
            return self._try_admit_matched(request, lane_id, match, host_match)
        finally:
            self.host.release(host_match)

    def _try_admit_matched(
        self, request: Request, lane_id: int, match: PrefixMatch | None, host_match: HostMatch | None
    ) -> bool:
        max_num_tokens, limit_kind = self._limit(request)
        num_pages = self.pages.pages_for(request.num_tokens)  # the known tokens; decoding grows the row
        if host_match is not None and match is not None:
            self.prefix.unpin(match.checkpoint)  # type: ignore[union-attr]
            match = None  # the parked entry holds a longer prefix
        if not self._slot_available():  # checked first: a failed admission must evict (park) nothing
            if match is not None:
                self.prefix.unpin(match.checkpoint)  # type: ignore[union-attr]
            return False
        if host_match is not None and not self._reclaim(num_pages):  # may park idle retained sequences
            host_match = None
            match = self._lookup(request)  # a device match needs fewer new pages
        if match is not None and not self._reclaim(num_pages - len(match.shared_page_ids)):
            self.prefix.unpin(match.checkpoint)  # type: ignore[union-attr]
            match = None  # its pinned partial page may be what is missing: try cold
        if match is None and host_match is None:
            if not self._reclaim(num_pages):
                return False
            if self.host is not None:  # that reclaim may have parked the match given up above: restore it
                host_match = self._host_lookup(request, None)  # (the runner copies parks before unparks)
                if host_match is not None:
                    self.host.hold(host_match)
                    try:
                        return self._try_admit_matched(request, lane_id, None, host_match)
                    finally:
                        self.host.release(host_match)
        slot = self.prefix.allocate_slot() if self.prefix is not None else self.slots.allocate()
        if slot is None:  # every other slot is a pinned checkpoint; the unpin at commit retries
            if match is not None:
                self.prefix.unpin(match.checkpoint)  # type: ignore[union-attr]
            return False
        shared = match.shared_page_ids if match is not None else ()
        self.pages.incref(shared)
        page_ids = tuple(shared) + tuple(self.pages.allocate(num_pages - len(shared)))
        cow = None
        if match is not None and match.partial_page_id is not None:
            cow = (match.partial_page_id, page_ids[len(shared)])
        reused = match.num_tokens if match is not None else 0
        if host_match is not None:
            assert self.host is not None
            self.host.restore(host_match, page_ids, slot, request.request_id, lane_id)
            reused = request.num_host_cached_tokens = host_match.num_tokens
        boundaries: deque[int] = deque()
        if self.prefix is not None and self.cache_config.max_boundary_saves:
            later = [p for p in request.checkpoint_positions if p > reused]
            boundaries.extend(later[-self.cache_config.max_boundary_saves :])
        self._admitted_seq += 1
        self.lanes[lane_id] = Lane(
            lane_id,
            request,
            page_ids,
            slot,
            max_num_tokens,
            limit_kind,
            self._admitted_seq,
            match.checkpoint if match is not None else None,
            cow,
            boundaries,
            host_restored=host_match is not None,
            restoring=host_match is not None,
        )
        request.status = RequestStatus.RUNNING
        request.admitted_time = self.clock()
        request.num_computed_tokens = request.num_cached_tokens = reused
        if reused:
            self.num_prefix_hits += 1
            self.num_prefix_hit_tokens += reused
        first = self._resumed.pop(request.request_id, None)
        if first is not None:  # a resume: usage reports the first admission
            request.num_cached_tokens, request.num_host_cached_tokens, request.admitted_time, done = first
            self.num_recomputed_tokens += max(0, done - reused)
        return True

    def _lookup(self, request: Request) -> PrefixMatch | None:
        """Longest checkpoint match, pinned; at least one prompt token is left to compute (logits)."""
        if self.prefix is None or len(self.prefix) == 0:
            return None
        limit = request.num_tokens - 1  # a resumed request may match its own output too
        extend_page_hashes(request.page_hashes, request.identity_ids, limit, self.pages.page_size)
        match = self.prefix.lookup(request.identity_ids, request.page_hashes, limit)
        if match is not None:
            self.prefix.pin(match.checkpoint)
            if self.num_draft_tokens:
                match = spec_cow_match(match, self.pages.page_size)
        return match

    def _host_lookup(self, request: Request, match: PrefixMatch | None) -> HostMatch | None:
        """A parked checkpoint longer than the device match (pure: nothing pinned, nothing moved)."""
        if self.host is None:
            return None
        limit = request.num_tokens - 1  # a resumed request may match its own output too
        extend_page_hashes(request.page_hashes, request.identity_ids, limit, self.pages.page_size)
        found = self.host.match(request.identity_ids, request.page_hashes, limit)
        best = match.num_tokens if match is not None else 0
        return found if found is not None and found.num_tokens > best else None

    def _slot_available(self) -> bool:
        """Whether a working slot can be had: a free one, or an unpinned checkpoint to evict."""
        if self.slots.num_free or self.prefix is None:
            return self.slots.num_free > 0
        return any(cp.num_pins == 0 for cp in self.prefix.checkpoints)

    def _reclaim(self, num_pages: int) -> bool:
        if self.prefix is None:
            return self.pages.can_allocate(num_pages)
        return self.prefix.reclaim_pages(num_pages)

    def _decode_row(self, lane: Lane, copies: list[tuple[int, int]]) -> RowPlan:
        """A decode-ready lane's row: its last token, plus its drafts when speculating (engine/scheduler/spec.py)."""
        if not self.num_draft_tokens:
            return self._row(lane, 1, copies)
        k = num_drafts(lane.drafts, lane.request, lane.max_num_tokens, self.reasoning_tokens is not None)
        self.spec_stats.plan(lane.request, len(lane.drafts), k)
        return self._row(lane, 1, copies, drafts=lane.drafts[:k])

    def _row(
        self, lane: Lane, n: int, copies: list[tuple[int, int]], drafts: tuple[int, ...] = ()
    ) -> RowPlan:
        request = lane.request
        start = request.num_computed_tokens
        end = start + n
        known = lane.num_known_tokens
        assert 1 <= n and end <= known, f"row of {n} tokens from {start} of {known}"
        save = None
        if lane.boundaries and lane.boundaries[0] == end:
            lane.boundaries.popleft()
            save = self.prefix.allocate_slot() if self.prefix is not None else None  # best effort
            if save is not None:
                lane.pending_saves.append((save, end))
        reset, copy_from = False, None
        if not lane.initialized:
            lane.initialized = True
            reset = lane.restore is None and not lane.host_restored
            copy_from = lane.restore.state_slot if lane.restore is not None else None
            if lane.cow is not None:
                copies.append(lane.cow)
        num_prefill = max(0, min(end, request.num_prompt_tokens) - start)
        self._step_rows[0 if num_prefill else 1] += 1
        self.num_prefill_tokens += num_prefill
        self.num_decode_tokens += n - num_prefill
        lane.drafts = ()  # consumed by this row (or dropped); the result brings the next ones
        fed = tuple(request.token_ids[start:end])
        fed += (PREVIOUS_TOKEN,) * (n - len(fed))  # sampled by this lane's row in flight (overlap)
        # the last known token: sample the next (and one more per draft: a verify row)
        num_sample = 1 + len(drafts) if end == known else 0
        num_output_tokens = request.num_output_tokens + lane.num_pending_tokens
        request.num_computed_tokens = end  # planned: the next plan may be built before this one commits
        lane.num_inflight_rows += 1
        lane.num_pending_tokens += num_sample
        return RowPlan(
            request_id=request.request_id,
            lane=lane.lane_id,
            token_ids=fed + drafts,
            start_pos=start,
            page_ids=lane.page_ids,
            state_slot=lane.state_slot,
            reset_state=reset,
            copy_state_from=copy_from,
            save_state_to=save,
            num_sample=num_sample,
            sampling_params=request.sampling_params,
            num_output_tokens=num_output_tokens,
            media=request.media,
        )

    # ---- commit ---------------------------------------------------------------------------------

    def commit(self, plan: StepPlan, result: StepResult) -> list[Event]:
        """Apply one executed step (engine/scheduler/commit.py): per row, commit `result.sampled_token_ids[i]`
        in order (each with the stop and length checks; the first that ends the request drops the rest),
        and count `num_rolled_back[i]` fed positions as not computed; then the host restores the runner
        reported (their lanes become runnable, or prefill cold when the restore failed). Plans are
        committed in the order they were scheduled.

        Returns the step's events (and any produced by `schedule()`, such as queue timeouts).
        """
        return committing.commit(self, plan, result)

    def _restore_failed(self, lane: Lane) -> None:
        """Re-plan a lane whose host restore failed as a cold prefill (same pages and slot, no row ran)."""
        assert not lane.initialized and lane.host_restored, "restore failure reported for a lane that ran"
        request = lane.request
        reused = request.num_computed_tokens
        assert self.host is not None
        self.host.failed(reused)
        self.num_prefix_hits -= 1
        self.num_prefix_hit_tokens -= reused
        lane.host_restored = False  # its first row resets the state
        request.num_computed_tokens = request.num_cached_tokens = request.num_host_cached_tokens = 0
        lane.boundaries.clear()
        if self.cache_config.max_boundary_saves:
            later = [p for p in request.checkpoint_positions if p > 0]
            lane.boundaries.extend(later[-self.cache_config.max_boundary_saves :])

    def _finish_reason(self, lane: Lane, token: int) -> FinishReason | None:
        params = lane.request.sampling_params
        if (token in self.eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids:
            return FinishReason.stop(token)
        if lane.request.num_tokens >= lane.max_num_tokens:
            return FinishReason(lane.limit_kind)
        return None

    # ---- release --------------------------------------------------------------------------------

    def _free_lane(self, lane: Lane, *, retain: bool) -> None:
        """Free a lane (its request has ended). With `retain`, its computed prefix and state become a checkpoint."""
        assert not lane.pending_saves and not lane.num_inflight_rows, (
            f"lane {lane.lane_id} freed with rows in flight"
        )
        request = lane.request
        self.lanes[lane.lane_id] = None
        if lane.restore is not None:
            self.prefix.unpin(lane.restore)  # type: ignore[union-attr]
        num_done = request.num_computed_tokens
        retain = retain and not request.splits_media(num_done)  # never a checkpoint inside an image's tokens
        if retain and self.prefix is not None and num_done >= 1 and not lane.restoring:
            self.prefix.insert(
                request.identity_ids, request.page_hashes, num_done, lane.page_ids, lane.state_slot
            )
        else:
            self.slots.free(lane.state_slot)
        self.pages.free(lane.page_ids)
        self._released.append(request.request_id)
        self._admission_dirty = True

    def _end(self, request: Request, reason: FinishReason) -> FinishEvent:
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        self.requests.pop(request.request_id, None)
        admitted, first = request.admitted_time, request.first_token_time
        queued_until = admitted if admitted is not None else self.clock()
        return FinishEvent(
            request.request_id,
            reason,
            request.num_prompt_tokens,
            request.num_output_tokens,
            request.num_cached_tokens,
            queue_seconds=max(queued_until - request.arrival_time, 0.0),
            prefill_seconds=None if admitted is None or first is None else max(first - admitted, 0.0),
            num_host_cached_tokens=request.num_host_cached_tokens,
            speculative=self.spec_stats.finish(request.request_id),
        )

    # ---- introspection --------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return sum(1 for lane in self.lanes if lane is not None)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_work(self) -> bool:
        host_pending = self.host is not None and self.host.has_pending()
        return bool(self.waiting) or self.num_running > 0 or bool(self._outbox) or host_pending

    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_running=self.num_running,
            num_waiting=self.num_waiting,
            num_pages=self.pages.num_pages,
            num_pages_used=self.pages.num_in_use,
            num_checkpoints=len(self.prefix) if self.prefix is not None else 0,
            num_prefix_hits=self.num_prefix_hits,
            num_prefix_hit_tokens=self.num_prefix_hit_tokens,
            num_prefill_tokens=self.num_prefill_tokens,
            num_decode_tokens=self.num_decode_tokens,
            num_steps=self._step_id,
            num_prefill_steps=self.num_prefill_steps,
            num_mixed_steps=self.num_mixed_steps,
            num_admission_scans=self.num_admission_scans,
            num_preemptions=self.num_preemptions,
            num_recomputed_tokens=self.num_recomputed_tokens,
            num_pages_cached=self.prefix.num_pages_held if self.prefix is not None else 0,
            num_pages_reclaimable=self.pages.num_reclaimable,
        )

    def check_integrity(self) -> None:
        """Prove page, slot and request accounting; RuntimeError with the disagreeing numbers."""
        check_integrity(self)


def _runnable(lane: Lane) -> bool:
    """A lane that may get a row: not restoring, not ended, and not about to finish by length (its token in
    flight reaches the limit: commit finishes it, so no row is wasted)."""
    if lane.restoring or lane.ending is not None:
        return False
    return lane.num_pending_tokens == 0 or lane.num_known_tokens < lane.max_num_tokens
