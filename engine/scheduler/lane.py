"""Lane: what one running request holds between admission and release (scheduler-private state)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.cache.prefix import Checkpoint
from engine.request import FinishKind, Request


@dataclass(slots=True, eq=False)
class Lane:
    """A running request's resources. Lives from admission to release."""

    lane_id: int
    request: Request
    page_ids: tuple[
        int, ...
    ]  # covers at least the computed positions; grows at the end (never past max_num_tokens - 1)
    state_slot: int
    max_num_tokens: int  # finish when the sequence reaches this length
    limit_kind: FinishKind  # LENGTH (max_tokens) or CONTEXT (max_context) at max_num_tokens
    admitted_seq: int  # admission order: prefill budget goes to the oldest first
    restore: Checkpoint | None  # pinned until the step that restores from it has run
    cow: tuple[int, int] | None  # (src, dst) page copy for the first step
    boundaries: deque[int] = field(default_factory=deque)  # checkpoint positions still to save
    initialized: bool = False  # the first step (reset / restore / copy-on-write) was emitted
    pending_saves: list[tuple[int, int]] = field(default_factory=list)  # (slot, position) of rows in flight
    host_restored: bool = False  # admitted with a host unpark into its pages and slot: no state reset
    restoring: bool = False  # that unpark is not yet reported complete: the lane gets no row
    drafts: tuple[int, ...] = ()  # speculative drafts for the next step (never in the request's tokens)
    # Overlap scheduling (engine/scheduler/inflight.py): rows planned and not yet committed, the tokens they
    # sample (known tokens = request.num_tokens + num_pending_tokens), and once the request has ended while a
    # row was in flight, whether its sequence is retained when the lane is freed (None: not ended).
    num_inflight_rows: int = 0
    num_pending_tokens: int = 0
    ending: bool | None = None

    @property
    def num_known_tokens(self) -> int:
        """The request's tokens plus those its rows in flight sample (fed next as `PREVIOUS_TOKEN`)."""
        return self.request.num_tokens + self.num_pending_tokens
