"""Plain data crossing from the scheduler to the runner (one `SchedulerOutput` per step).

Nothing here references a live `Request`: the runner builds its tensors from these ints alone.

How a runner executes one `SchedulerOutput`, in this order:
  0. host parking (`--host-kv-cache-mib`; `engine/parking.py`): every `host_parks` entry (copy a
     retained sequence's pages and states to host RAM; the scheduler has already freed those ids, so
     this must precede anything that writes them), then every `host_unparks` entry (copy a parked
     entry into a just-admitted lane's own pages and working slot), then make the forward wait for
     the parks only. A restoring lane has no row until the runner reports its copies complete
     (`HostRestoreReport`, handed to `Scheduler.commit` by the engine loop).
  1. `page_copies`: for each (src, dst), copy KV page src into page dst in every attention layer
     (copy-on-write of a reused checkpoint's partial last page).
  2. per row, before the forward: if `reset_state`, zero the GDN state in `state_slot`; if
     `copy_state_from` is set, copy that snapshot slot into `state_slot` (a prefix-reuse restore).
  3. one forward over all rows: row r feeds `token_ids` at positions `start_pos ..
     start_pos + num_tokens - 1`, writes their KV at `slot_mapping(page_size)`, reads KV through
     `page_ids` (its page-table row) and reads/writes GDN state in `state_slot`.
  4. per row, after the forward: if `save_state_to` is set, copy `state_slot` into it (a checkpoint
     at `start_pos + num_tokens`, a message boundary).
  5. sample one token for each row with `sample` (the logits of its last token), in row order; hand
     that list to `Scheduler.commit`.
Rows are compacted: decode rows (one token) come first in lane order, then prefill chunks.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.request import SamplingParams


@dataclass(frozen=True, slots=True)
class ScheduledRequest:
    request_id: str  # for the runner's per-request sampler state (seeded generator, penalty counts)
    lane: int  # 0 .. max_concurrency-1
    token_ids: tuple[int, ...]  # tokens to feed this step
    start_pos: int  # position of token_ids[0] (= tokens already computed)
    page_ids: tuple[int, ...]  # the request's whole page-table row; constant for its lifetime
    state_slot: int  # GDN working state
    reset_state: bool  # first step of a cold request: zero state_slot before the forward
    copy_state_from: int | None  # first step of a prefix hit: copy this snapshot slot first
    save_state_to: int | None  # after the forward, snapshot state_slot into this slot
    sample: bool  # this step reaches the end of the known tokens: sample the next one
    sampling_params: SamplingParams
    num_output_tokens: int  # output tokens before this step (0 until the first sample)

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
    """Copy a retained sequence to host RAM as entry `key` (`HostParking.park`)."""

    key: int
    page_ids: tuple[int, ...]  # pages covering [0, max L)
    token_ids: tuple[int, ...]  # [0, max L)
    checkpoints: tuple[tuple[int, int], ...]  # (L, state slot holding the state after token L-1)


@dataclass(frozen=True, slots=True)
class HostUnpark:
    """Copy checkpoint `num_tokens` of parked entry `key` into a lane (`HostParking.unpark`)."""

    key: int
    page_ids: tuple[int, ...]  # the lane's first ceil(num_tokens / page_size) pages
    state_slot: int  # the lane's working slot
    num_tokens: int
    keep: bool  # keep the entry parked (it holds later checkpoints than the one restored)
    request_id: str = ""  # the restoring request (its lane is not runnable until the report)
    lane: int = -1


@dataclass(frozen=True, slots=True)
class HostRestoreReport:
    """Runner -> scheduler (through the engine loop): a `HostUnpark` finished. `ok=False`: the entry was
    corrupt or did not match the cache; it has been dropped and the lane must prefill cold."""

    request_id: str
    lane: int
    ok: bool
    error: str = ""


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    step_id: int
    requests: tuple[ScheduledRequest, ...]
    page_copies: tuple[tuple[int, int], ...]  # (src_page, dst_page), before the forward
    # Requests that ended since the previous output: the runner drops their sampler state.
    released_request_ids: tuple[str, ...]
    host_parks: tuple[HostPark, ...] = ()
    host_unparks: tuple[HostUnpark, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not self.requests

    @property
    def num_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.requests)

    @property
    def num_sampled(self) -> int:
        return sum(1 for r in self.requests if r.sample)


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """Plain numbers for /stats and metrics (the engine never imports monitor)."""

    num_running: int
    num_waiting: int
    num_pages: int
    num_pages_used: int
    num_checkpoints: int
    num_prefix_hits: int
    num_prefix_hit_tokens: int
    num_prefill_tokens: int  # cumulative
    num_decode_tokens: int  # cumulative
    num_steps: int
    num_admission_scans: int
