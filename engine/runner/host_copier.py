r"""HostCopier: host parking's copies, the runner's side: device cache <-> host blocks, on a copy stream.

Owns: the host slabs (`HostSlabs`), the dedicated copy stream and its events (`ParkHandle`), and the
copy seconds. Must not touch: which entries exist, the LRU, pins, which blocks are free (the scheduler's
`engine.cache.host.HostIndex` decides all that and names the blocks in each `HostPark` / `HostUnpark`),
requests, page / slot ownership.

On CUDA the copies run on one dedicated stream that first waits for the compute stream; one stream
keeps them FIFO, so host blocks the scheduler frees (an eviction, a completed restore) are rewritten
only after every earlier copy that read them. Runs of consecutive page ids are copied directly (one
copy per run per tensor per host extent); scattered pages go through a device staging chunk
(`CopyPlan`). Slabs are pinned (page-locked) on CUDA and plain memory on CPU, where the same code
copies synchronously.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping, Sequence

import torch

from engine.cache.host_blocks import MIB, HostBudget
from engine.cache.host_layout import CacheGeometry, ExtraSpec
from engine.cache.kv import ModelCache
from engine.runner.host_layout import CopyPlan, cache_geometry, paged_tensors, state_tensors
from engine.runner.host_slabs import HostSlabs

DEFAULT_GATHER_RUN_BYTES = 1 * MIB
DEFAULT_STAGING_BYTES = 64 * MIB


class HostEntryMismatch(ValueError):
    """A parked entry does not fit the cache it is restored into (the scheduler drops it)."""


class ParkHandle:
    """One park or unpark: its size and, on CUDA, the events bracketing its copies on the copy stream."""

    __slots__ = ("kind", "entry_key", "num_bytes", "num_runs", "num_copies", "_start", "_end", "_seconds")

    def __init__(
        self, kind: str, entry_key: Hashable, num_bytes: int, num_runs: int, num_copies: int,
        start: torch.cuda.Event | None, end: torch.cuda.Event | None, seconds: float | None,
    ) -> None:  # fmt: skip
        self.kind = kind  # "park" | "unpark"
        self.entry_key = entry_key
        self.num_bytes = num_bytes
        self.num_runs = num_runs  # coalesced runs of consecutive device page ids
        self.num_copies = num_copies  # copy calls (runs x paged tensors, split at host extent edges, + state)
        self._start, self._end, self._seconds = start, end, seconds

    def done(self) -> bool:
        return self._end is None or self._end.query()

    def synchronize(self) -> None:
        if self._end is not None:
            self._end.synchronize()

    def wait(self, stream: torch.cuda.Stream | None = None) -> None:
        """Make `stream` (default: the current one) wait for these copies, without blocking the host."""
        if self._end is not None:
            (stream or torch.cuda.current_stream(self._end.device)).wait_event(self._end)

    @property
    def seconds(self) -> float | None:
        """Copy time (device time on CUDA), or None while the copies are still running."""
        if self._seconds is None and self._start is not None and self._end is not None and self._end.query():
            self._seconds = self._start.elapsed_time(self._end) / 1000.0
        return self._seconds


class HostCopier:
    """Copies between one cache geometry and the host slabs of one budget. Use: `park` / `unpark` with the
    blocks the scheduler chose; `poll` once per step; `stats_seconds` for the copy times."""

    def __init__(
        self, geometry: CacheGeometry, budget: HostBudget, *, device: torch.device | str = "cpu",
        gather_run_bytes: int = DEFAULT_GATHER_RUN_BYTES, staging_bytes: int = DEFAULT_STAGING_BYTES,
    ) -> None:  # fmt: skip
        self.geometry = geometry
        self.gather_run_bytes = gather_run_bytes  # page runs shorter than this on average go through staging
        self.staging_bytes = staging_bytes  # device staging per gather chunk
        self.device = torch.device(device)
        is_cuda = self.device.type == "cuda"
        self.slabs = HostSlabs(budget, pin_memory=is_cuda)
        self._stream = torch.cuda.Stream(self.device) if is_cuda else None
        self._last_event: torch.cuda.Event | None = None
        self._pending: list[ParkHandle] = []  # CUDA handles whose seconds are not yet counted
        self.seconds = {"park": 0.0, "unpark": 0.0}  # completed copies only

    def park(
        self, cache: ModelCache, *, block_ids: Sequence[int], page_ids: Sequence[int], state_slots: Sequence[int],
        extras: Sequence[ExtraSpec] = (), extra: Mapping[str, torch.Tensor] | None = None, key: Hashable = None,
    ) -> ParkHandle:  # fmt: skip
        """Copy pages `page_ids` (entry pages 0..len-1), the state of each slot in `state_slots` (one per
        checkpoint, in order) and `extra` (laid out as `extras`) into host blocks `block_ids`."""
        self._check_geometry(cache, f"park({key!r})")
        plan = self._plan(block_ids, to_host=True)
        num_pages = len(page_ids)
        num_runs = plan.add_pages(self.geometry, paged_tensors(cache), num_pages, page_ids)
        state, logical = state_tensors(cache), num_pages * self.geometry.bytes_per_page
        for i, slot in enumerate(state_slots):
            plan.add_state(self.geometry, state, logical + i * self.geometry.bytes_per_checkpoint, slot)
        plan.add_extras(extras, logical + len(state_slots) * self.geometry.bytes_per_checkpoint, extra or {})
        want = self.geometry.entry_bytes(num_pages, len(state_slots), sum(s.num_bytes for s in extras))
        assert plan.num_bytes == want, f"park copies {plan.num_bytes} bytes of a {want}-byte entry"
        return self._execute(plan, "park", key, num_runs)

    def unpark(
        self, cache: ModelCache, *, block_ids: Sequence[int], entry_num_pages: int, checkpoint_index: int,
        page_ids: Sequence[int], state_slot: int, num_checkpoints: int = 0, extras: Sequence[ExtraSpec] = (),
        extra: Mapping[str, torch.Tensor] | None = None, key: Hashable = None,
    ) -> ParkHandle:  # fmt: skip
        """Copy entry pages 0..len(page_ids)-1 into `page_ids` and snapshot `checkpoint_index` into
        `state_slot` (and, when `extra` destinations are given, the entry's extras, which follow its
        `num_checkpoints` snapshots). HostEntryMismatch when `cache` is not the geometry parked from."""
        try:
            self._check_geometry(cache, f"unpark({key!r})")
        except ValueError as exc:
            raise HostEntryMismatch(str(exc)) from None
        if extra is not None and set(extra) != {s.name for s in extras}:
            raise ValueError(f"unpark({key!r}): extras {sorted(extra)} != parked {[s.name for s in extras]}")
        plan = self._plan(block_ids, to_host=False)
        num_runs = plan.add_pages(self.geometry, paged_tensors(cache), entry_num_pages, page_ids)
        logical = entry_num_pages * self.geometry.bytes_per_page
        plan.add_state(self.geometry, state_tensors(cache), logical + checkpoint_index * self.geometry.bytes_per_checkpoint,
                       state_slot)  # fmt: skip
        if extra is not None:
            plan.add_extras(extras, logical + num_checkpoints * self.geometry.bytes_per_checkpoint, extra)
        return self._execute(plan, "unpark", key, num_runs)

    def _plan(self, block_ids: Sequence[int], to_host: bool) -> CopyPlan:
        self.slabs.ensure(block_ids)
        return CopyPlan(self.slabs, block_ids, to_host, self.gather_run_bytes, self.staging_bytes)

    def _check_geometry(self, cache: ModelCache, what: str) -> None:
        geometry = cache_geometry(cache)
        if geometry != self.geometry:
            raise ValueError(f"{what}: cache geometry {geometry} != parking geometry {self.geometry}")

    def _execute(self, plan: CopyPlan, kind: str, entry_key: Hashable, num_runs: int) -> ParkHandle:
        if self._stream is None:
            start = time.perf_counter()
            plan.execute(non_blocking=False)
            seconds = time.perf_counter() - start
            self.seconds[kind] += seconds
            return ParkHandle(kind, entry_key, plan.num_bytes, num_runs, plan.num_copies, None, None, seconds)
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self._stream):
            begin.record()
            plan.execute(non_blocking=True)
            end.record()
        self._last_event = end
        handle = ParkHandle(kind, entry_key, plan.num_bytes, num_runs, plan.num_copies, begin, end, None)
        self._pending.append(handle)
        return handle

    def wait_copies(self, stream: torch.cuda.Stream | None = None) -> None:
        """Make `stream` (default: current) wait for every copy issued so far (no host block)."""
        if self._last_event is not None:
            (stream or torch.cuda.current_stream(self.device)).wait_event(self._last_event)

    def synchronize(self) -> None:
        """Block the host until every copy issued so far is complete."""
        if self._last_event is not None:
            self._last_event.synchronize()
        self.poll()

    def poll(self) -> None:
        """Count the seconds of CUDA copies that have completed (call once per engine step)."""
        still: list[ParkHandle] = []
        for handle in self._pending:
            seconds = handle.seconds
            if seconds is None:
                still.append(handle)
            else:
                self.seconds[handle.kind] += seconds
        self._pending = still
