"""The step contract: plain data crossing between the scheduler and the runner, one pair per step.

`StepPlan` goes down (scheduler -> runner), `StepResult` comes up (runner -> scheduler, through the
engine loop). Nothing here references a live `Request` or a tensor: the runner builds its tensors from
these ints alone, and the scheduler reads back plain token lists. This module imports neither side;
both import it (enforced by `.importlinter`).

How a runner executes one `StepPlan`, in this order:
  0. host parking (`--host-kv-cache-mib`; engine/runner/host_copies.py): every `host_parks` entry (copy
     a retained sequence's pages and states to the host blocks the scheduler chose; the scheduler has
     already freed those page and slot ids, so this must precede anything that writes them), then every
     `host_unparks` entry (copy a parked entry into a just-admitted lane's own pages and working slot),
     then make the forward wait for the parks only. A restoring lane has no row until the runner reports
     its copies complete (`HostRestoreReport` in `StepResult.host_reports`).
  1. `page_copies`: for each (src, dst), copy KV page src into page dst in every attention layer
     (copy-on-write of a reused checkpoint's partial last page).
  2. per row, before the forward: if `reset_state`, zero the GDN state in `state_slot`; if
     `copy_state_from` is set, copy that snapshot slot into `state_slot` (a prefix-reuse restore).
  3. one forward over all rows: row r feeds `token_ids` at positions `start_pos ..
     start_pos + num_tokens - 1`, writes their KV at `slot_mapping(page_size)`, reads KV through
     `page_ids` (its page-table row) and reads/writes GDN state in `state_slot`.
  4. per row, after the forward: if `save_state_to` is set, copy `state_slot` into it (a checkpoint
     at `start_pos + num_tokens`, a message boundary).
  5. per row, the logits of its last `num_sample` fed positions, sampled in position order (today the
     scheduler asks for 0 or 1: the last token of a row that reaches the end of the known tokens).
  6. hand back a `StepResult`: per row, the tokens to commit (`sampled_token_ids[i]`, empty for a row
     that samples nothing), how many fed draft positions were accepted and how many are rolled back,
     and the host restores completed or failed since the last result.
Rows are compacted: decode rows (one token) come first in lane order, then prefill chunks.

Overlap scheduling (`--overlap`, engine/core.py): the scheduler may build plan N+1 before plan N's result
is back. A row of plan N+1 then feeds `PREVIOUS_TOKEN` (-1) for the token its request's row of plan N
sampled: the runner takes that id from plan N's sampled ids, still on the device (no host sync). Only
the last fed token of a row can be one, and only when plan N is `overlappable` (every row that samples
needs nothing from the host between steps: see `host_free`).

The scheduler commits each row's tokens in order with the same stop and length checks, stopping at
the first that ends the request (the rest are dropped); a rolled-back position is treated as not
computed (`num_computed_tokens = end_pos - num_rolled_back`). A verify step of k+1 positions per row
(speculative decoding) is therefore only different numbers: `num_sample = k + 1`, up to k+1 tokens
back, `num_rolled_back = k - num_accepted`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.request import SamplingParams

if TYPE_CHECKING:
    from engine.media.prompt import PromptMedia
# In `RowPlan.token_ids`: "the token this request's row of the previous plan sampled" (overlap scheduling).
PREVIOUS_TOKEN = -1


def host_free(params: SamplingParams) -> bool:
    """Whether a row sampling with `params` lets the next plan be built before its token reaches the host.

    Falls back to the synchronous step (the engine waits for the token first): an output grammar (the next
    mask needs the matcher advanced on the host), logprobs (computed on the host from the logits) and a
    thinking budget (the scheduler may replace the sampled token with the reasoning's forced close).
    Presence / frequency penalties do not: the runner keeps their counts on the device and adds each sampled
    id there (engine/runner/penalties.py)."""
    return params.structured is None and params.logprobs is None and params.thinking_budget is None


@dataclass(frozen=True, slots=True)
class RowPlan:
    """One row of a step: a request's tokens to feed, where its KV and state live, what to sample."""

    request_id: str  # for the runner's per-request sampler state (seeded generator, penalty counts)
    lane: int  # 0 .. max_concurrency-1
    token_ids: tuple[int, ...]  # tokens to feed this step
    start_pos: int  # position of token_ids[0] (= tokens already computed)
    page_ids: tuple[
        int, ...
    ]  # the request's page-table row: covers every fed position; only grows at the end
    state_slot: int  # GDN working state
    reset_state: bool  # first step of a cold request: zero state_slot before the forward
    copy_state_from: int | None  # first step of a prefix hit: copy this snapshot slot first
    save_state_to: int | None  # after the forward, snapshot state_slot into this slot
    num_sample: int  # the last num_sample fed positions give logits and a token each (0: none)
    sampling_params: SamplingParams
    num_output_tokens: int  # output tokens before this step (0 until the first sample)
    # The request's prompt media (the same object every step; None for text): the runner splices the tower's
    # rows at the placeholders this row feeds and takes the 3D positions / rope delta from it. Its pixel
    # tensors are an opaque payload to the scheduler.
    media: PromptMedia | None = None

    def __post_init__(self) -> None:
        assert 0 <= self.num_sample <= len(self.token_ids), (
            f"{self.request_id}: num_sample={self.num_sample} for {len(self.token_ids)} fed tokens"
        )

    @property
    def sample(self) -> bool:
        return self.num_sample > 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def end_pos(self) -> int:
        return self.start_pos + len(self.token_ids)

    def slot_mapping(self, page_size: int) -> list[int]:
        """KV slot of each fed token: page_ids[pos // page_size] * page_size + pos % page_size."""
        pages = self.page_ids
        return [
            pages[p // page_size] * page_size + p % page_size for p in range(self.start_pos, self.end_pos)
        ]


@dataclass(frozen=True, slots=True)
class HostPark:
    """Copy a retained sequence into host blocks `block_ids` as entry `key` (the scheduler chose the blocks).

    Entry bytes, layer-major (engine/cache/host_layout.py): pages 0..len(page_ids)-1 of every paged
    tensor, then one state snapshot per `state_slots` entry, in order.
    """

    key: int
    page_ids: tuple[int, ...]  # pages covering [0, max L)
    state_slots: tuple[int, ...]  # one per checkpoint, ascending L: the slot holding the state after L-1
    block_ids: tuple[int, ...]  # host blocks the entry's bytes go to, in order


@dataclass(frozen=True, slots=True)
class HostUnpark:
    """Copy checkpoint `checkpoint_index` of parked entry `key` (in `block_ids`) into a lane's pages and slot."""

    key: int
    page_ids: tuple[int, ...]  # the lane's first ceil(num_tokens / page_size) pages
    state_slot: int  # the lane's working slot
    num_tokens: int  # the restored checkpoint L
    block_ids: tuple[int, ...]  # the entry's host blocks
    entry_num_pages: int  # the entry's page count (the stride between paged tensors in its bytes)
    checkpoint_index: int  # which of the entry's state snapshots
    request_id: str = ""  # the restoring request (its lane is not runnable until the report)
    lane: int = -1


@dataclass(frozen=True, slots=True)
class HostRestoreReport:
    """Runner -> scheduler: a `HostUnpark` finished (or its lane was released and its copies are queued
    before anything that reuses the pages). `ok=False`: the copy could not run; `drop_reason` says why
    ("mismatch": the entry does not fit the cache, "corrupt": it cannot be restored). The scheduler then
    drops the entry (only it changes the host index) and re-plans the lane as a cold prefill."""

    request_id: str
    lane: int
    ok: bool
    error: str = ""
    drop_reason: str = ""


@dataclass(frozen=True, slots=True)
class StepPlan:
    """Everything the runner does in one step (see the module docstring for the order)."""

    step_id: int
    rows: tuple[RowPlan, ...]
    page_copies: tuple[tuple[int, int], ...]  # (src_page, dst_page), before the forward
    # Requests that ended since the previous plan: the runner drops their sampler state.
    released_request_ids: tuple[str, ...]
    host_parks: tuple[HostPark, ...] = ()
    host_unparks: tuple[HostUnpark, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not self.rows

    @property
    def num_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.rows)

    @property
    def num_sampled(self) -> int:
        """Rows that sample at least one position."""
        return sum(1 for r in self.rows if r.sample)

    @property
    def overlappable(self) -> bool:
        """Whether the next plan may be built (and may feed `PREVIOUS_TOKEN`) before this plan's result is
        back: every sampling row samples one position (no verify rows) with `host_free` parameters."""
        return all(r.num_sample <= 1 and host_free(r.sampling_params) for r in self.rows if r.sample)


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one executed `StepPlan` produced, per row of the plan, in row order."""

    sampled_token_ids: tuple[tuple[int, ...], ...]  # per row: the tokens to commit (() when it samples none)
    num_accepted: tuple[int, ...]  # per row: fed draft positions accepted (0 without speculation)
    num_rolled_back: tuple[int, ...]  # per row: fed positions whose KV / state no longer count (0 today)
    host_reports: tuple[HostRestoreReport, ...] = ()  # restores completed or failed since the last result
    # Per row, filled only when a request asked for logprobs (None: nobody did). The shape is the
    # logprobs issue's to define.
    logprobs: tuple[Any, ...] | None = None
    # Speculative decoding (`--spec`): per row, the drafts proposed for its next step (() for none). The
    # scheduler keeps them beside the request, never in its tokens, and feeds them as the next verify row.
    draft_token_ids: tuple[tuple[int, ...], ...] = ()

    @classmethod
    def of_sampled(
        cls,
        plan: StepPlan,
        sampled: Sequence[Sequence[int]],
        host_reports: Sequence[HostRestoreReport] = (),
    ) -> StepResult:
        """A result for `plan` from the token lists of its sampling rows (in row order), nothing rolled back."""
        tokens: list[tuple[int, ...]] = []
        it = iter(sampled)
        for row in plan.rows:
            tokens.append(tuple(next(it)) if row.sample else ())
        assert next(it, None) is None, f"{len(sampled)} token lists for {plan.num_sampled} sampling rows"
        zeros = (0,) * len(plan.rows)
        return cls(tuple(tokens), zeros, zeros, tuple(host_reports))

    def check(self, plan: StepPlan) -> None:
        """ValueError unless this result has one entry per row of `plan` and each row's counts fit it."""
        n = len(plan.rows)
        if not len(self.sampled_token_ids) == len(self.num_accepted) == len(self.num_rolled_back) == n:
            raise ValueError(
                f"StepResult has {len(self.sampled_token_ids)} token lists, {len(self.num_accepted)} accepted and "
                f"{len(self.num_rolled_back)} rolled-back counts for {n} rows"
            )
        if self.draft_token_ids and len(self.draft_token_ids) != n:
            raise ValueError(f"StepResult has {len(self.draft_token_ids)} draft lists for {n} rows")
        for row, tokens, rolled_back in zip(
            plan.rows, self.sampled_token_ids, self.num_rolled_back, strict=True
        ):
            if bool(tokens) != row.sample or not 0 <= rolled_back < max(1, row.num_tokens):
                raise ValueError(
                    f"row {row.request_id!r}: {len(tokens)} tokens back for num_sample={row.num_sample}, "
                    f"{rolled_back} of {row.num_tokens} fed positions rolled back"
                )
