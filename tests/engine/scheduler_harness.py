"""Test harness for the scheduler: a fake runner that executes a `StepPlan` on plain lists.

It is not a mock of the real runner (engine/runner/): it is the smallest executor of the documented
step contract (engine/step.py), so the scheduler's accounting is tested without a model. It keeps

- `kv[slot]`: the token id whose KV lives in each token slot of the pool, written at `slot_mapping`;
- `state[slot]`: for each GDN state slot, the tuple of tokens it has absorbed (a perfect "recurrent
  state": it summarises exactly the tokens fed into it);
- `host[key]`: a parked entry's pages and state snapshots (host parking's copies, when the scheduler
  has a host index attached); every unpark is reported complete in the same step.

Every row checks that the KV it reads through its page-table row equals the tokens its state has
absorbed, so a wrong page table, a missing copy-on-write, a clobbered shared page or a wrong state
restore fails loudly. The sampled token is a fixed function of the state (the whole context), so a
prefix-reused request must produce exactly the tokens of a cold one.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.config import CacheConfig, SchedulerConfig
from engine.request import Event, FinishEvent, ReasoningTokens, Request, SamplingParams, TokenEvent
from engine.scheduler import Scheduler
from engine.step import HostRestoreReport, StepPlan, StepResult

VOCAB = 1000


def context_token(context: tuple[int, ...]) -> int:
    """The fake model: a deterministic token from the whole context, never below 10 (EOS ids live there)."""
    acc = 7
    for tok in context:
        acc = (acc * 31 + tok) % 1_000_003
    return 10 + acc % (VOCAB - 10)


class FakeRunner:
    def __init__(
        self, scheduler: Scheduler, token_fn: Callable[[tuple[int, ...]], int] = context_token
    ) -> None:
        self.page_size = scheduler.pages.page_size
        self.kv: list[int | None] = [None] * (scheduler.pages.num_pages * self.page_size)
        self.state: list[tuple[int, ...] | None] = [None] * scheduler.slots.num_slots
        self.token_fn = token_fn
        self.num_page_copies = 0
        self.num_restores = 0
        self.host: dict[int, tuple[list[list[int | None]], list[tuple[int, ...] | None]]] = {}
        self.num_unparks = 0

    def execute(self, out: StepPlan) -> StepResult:
        size = self.page_size
        for park in out.host_parks:  # before anything else: the scheduler has freed these ids
            pages = [self.kv[p * size : (p + 1) * size] for p in park.page_ids]
            self.host[park.key] = (pages, [self.state[slot] for slot in park.state_slots])
        reports = []
        for unpark in out.host_unparks:
            pages, states = self.host[unpark.key]
            for page_id, data in zip(unpark.page_ids, pages, strict=False):
                self.kv[page_id * size : (page_id + 1) * size] = data
            self.state[unpark.state_slot] = states[unpark.checkpoint_index]
            reports.append(HostRestoreReport(unpark.request_id, unpark.lane, True))
            self.num_unparks += 1
        for src, dst in out.page_copies:
            self.kv[dst * size : (dst + 1) * size] = self.kv[src * size : (src + 1) * size]
            self.num_page_copies += 1
        for row in out.rows:
            if row.reset_state:
                self.state[row.state_slot] = ()
            if row.copy_state_from is not None:
                self.state[row.state_slot] = self.state[row.copy_state_from]
                self.num_restores += 1
        sampled: list[list[int]] = []
        for row in out.rows:
            before = self.state[row.state_slot]
            assert before is not None and len(before) == row.start_pos, (
                f"{row.request_id}: state holds {None if before is None else len(before)} tokens, "
                f"start_pos {row.start_pos}"
            )
            for slot, tok in zip(row.slot_mapping(size), row.token_ids, strict=True):
                self.kv[slot] = tok
            after = before + row.token_ids
            self.state[row.state_slot] = after
            seen = tuple(self.kv[row.page_ids[p // size] * size + p % size] for p in range(row.end_pos))
            assert seen == after, f"{row.request_id}: KV through the page table disagrees with the state"
            if row.sample:
                sampled.append([self.token_fn(after)])
        for row in out.rows:
            if row.save_state_to is not None:
                self.state[row.save_state_to] = self.state[row.state_slot]
        return StepResult.of_sampled(out, sampled, reports)

    def check_checkpoints(self, scheduler: Scheduler) -> None:
        """Every checkpoint's pages hold the tokens its state snapshot absorbed."""
        if scheduler.prefix is None:
            return
        size = self.page_size
        for cp in scheduler.prefix.checkpoints:
            state = self.state[cp.state_slot]
            assert state is not None and len(state) == cp.num_tokens, f"checkpoint {cp.checkpoint_id} state"
            seen = tuple(self.kv[cp.page_ids[p // size] * size + p % size] for p in range(cp.num_tokens))
            assert seen == state, f"checkpoint {cp.checkpoint_id}: pages disagree with its state"


def make_scheduler(
    *,
    lanes: int = 1,
    num_pages: int = 8,
    page_size: int = 4,
    max_context: int = 32,
    prefill_chunk: int = 8,
    prefill_chunk_decoding: int | None = None,
    max_pending: int = 16,
    timeout_ms: int = 30_000,
    prefix_reuse: bool = True,
    max_checkpoints: int = 4,
    max_boundary_saves: int = 4,
    eos: tuple[int, ...] = (),
    reasoning_tokens: ReasoningTokens | None = None,
    clock: Callable[[], float] = lambda: 0.0,
) -> Scheduler:
    config = SchedulerConfig(
        max_context=max_context,
        max_concurrency=lanes,
        max_pending_requests=max_pending,
        pending_timeout_ms=timeout_ms,
        prefill_chunk=prefill_chunk,
        prefill_chunk_decoding=prefill_chunk_decoding,
        prefill_chunk_multiple=1,  # chunk at a few tokens on these short prompts
    )
    cache = CacheConfig(
        page_size=page_size,
        prefix_reuse=prefix_reuse,
        max_checkpoints=max_checkpoints,
        max_boundary_saves=max_boundary_saves,
    )
    return Scheduler(
        config, cache, num_pages=num_pages, eos_token_ids=eos, reasoning_tokens=reasoning_tokens, clock=clock
    )


def request(
    request_id: str,
    prompt: list[int],
    max_tokens: int = 4,
    *,
    arrival: float = 0.0,
    boundaries: tuple[int, ...] = (),
    **sampling: object,
) -> Request:
    params = SamplingParams(max_tokens=max_tokens, **sampling)  # type: ignore[arg-type]
    return Request(request_id, prompt, params, arrival_time=arrival, checkpoint_positions=boundaries)


class Driver:
    """Runs steps, checks integrity after every one, and records each request's events."""

    def __init__(self, scheduler: Scheduler, runner: FakeRunner | None = None) -> None:
        self.scheduler = scheduler
        self.runner = runner or FakeRunner(scheduler)
        self.tokens: dict[str, list[int]] = {}
        self.finishes: dict[str, list[FinishEvent]] = {}
        self.num_steps = 0

    def record(self, events: list[Event] | FinishEvent | None) -> None:
        if events is None:
            return
        for event in [events] if isinstance(events, FinishEvent) else events:
            if isinstance(event, TokenEvent):
                assert event.request_id not in self.finishes, f"{event.request_id}: token after its finish"
                self.tokens.setdefault(event.request_id, []).extend(event.token_ids)
            else:
                self.finishes.setdefault(event.request_id, []).append(event)

    def add(self, req: Request) -> FinishEvent | None:
        event = self.scheduler.add_request(req)
        self.record(event)
        self.scheduler.check_integrity()
        return event

    def step(self) -> StepPlan:
        out = self.scheduler.schedule()
        result = self.runner.execute(out)
        self.record(self.scheduler.commit(out, result))
        self.scheduler.check_integrity()
        self.runner.check_checkpoints(self.scheduler)
        self.num_steps += 1
        config = self.scheduler.config
        budget = config.max_num_batched_tokens
        assert out.num_tokens <= budget, f"step ran {out.num_tokens} tokens, budget {budget}"
        # A decode row is the one-token row that samples (its lane had exactly one token left); any other
        # row is a prefill chunk. With a decode row in the step, prefill gets the smaller budget.
        num_decode = sum(1 for row in out.rows if row.num_tokens == 1 and row.sample)
        prefill_budget = config.effective_prefill_chunk_decoding if num_decode else config.prefill_chunk
        num_prefill = out.num_tokens - num_decode
        assert num_prefill <= prefill_budget, (
            f"step prefilled {num_prefill} tokens beside {num_decode} decode rows, budget {prefill_budget}"
        )
        return out

    def run(self, max_steps: int = 10_000) -> None:
        while self.scheduler.has_work():
            out = self.step()
            # A lane restoring from the host has no row in the step that carries its unpark.
            idle = out.is_empty and not out.host_unparks
            assert not idle or not self.scheduler.num_running, "a step with running lanes ran nothing"
            assert self.num_steps < max_steps, "the scheduler did not drain"

    def reason(self, request_id: str) -> FinishEvent:
        events = self.finishes[request_id]
        assert len(events) == 1, f"{request_id}: {len(events)} terminal events"
        return events[0]
