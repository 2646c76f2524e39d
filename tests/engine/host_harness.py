"""Host parking's two halves joined the way the engine joins them, for the CPU and GPU host tests.

`Parking` is the scheduler's `HostIndex` (decisions: entries, LRU, pins, blocks) with the runner's
`HostCopier` (bytes) beside it: `park` decides then copies into the blocks the index chose, `unpark`
checks, copies, then lets the index unpin / free; a geometry mismatch makes the index drop the entry (in
the engine the runner reports it and the scheduler drops it). It adds no logic of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping, Sequence

import torch

from engine.cache.host import HostIndex, HostParkingStats
from engine.cache.host_blocks import DEFAULT_BLOCK_BYTES, DEFAULT_SLAB_BYTES, HostBudget
from engine.cache.host_layout import CacheGeometry, ExtraSpec
from engine.cache.kv import ModelCache
from engine.runner.host_copier import (
    DEFAULT_GATHER_RUN_BYTES,
    DEFAULT_STAGING_BYTES,
    HostCopier,
    HostEntryMismatch,
    ParkHandle,
)


class Parking(HostIndex):
    def __init__(
        self, geometry: CacheGeometry, capacity_bytes: int, *, slab_bytes: int = DEFAULT_SLAB_BYTES,
        block_bytes: int = DEFAULT_BLOCK_BYTES, device: torch.device | str = "cpu",
        gather_run_bytes: int = DEFAULT_GATHER_RUN_BYTES, staging_bytes: int = DEFAULT_STAGING_BYTES,
    ) -> None:  # fmt: skip
        super().__init__(geometry, HostBudget(capacity_bytes, slab_bytes, block_bytes))
        self.copier = HostCopier(
            geometry,
            self.budget,
            device=device,
            gather_run_bytes=gather_run_bytes,
            staging_bytes=staging_bytes,
        )

    @classmethod
    def from_mib(
        cls, geometry: CacheGeometry, host_kv_cache_mib: int, *, block_bytes: int | None = None
    ) -> Parking:
        budget = HostBudget.from_mib(host_kv_cache_mib)
        if block_bytes is not None:
            budget = dataclasses.replace(budget, block_bytes=block_bytes)
        return cls(
            geometry, budget.capacity_bytes, slab_bytes=budget.slab_bytes, block_bytes=budget.block_bytes
        )

    def park(
        self, key: Hashable, cache: ModelCache, *, page_ids: Sequence[int], token_ids: Sequence[int],
        checkpoints: Sequence[tuple[int, int]], extra: Mapping[str, torch.Tensor] | None = None,
    ) -> ParkHandle | None:  # fmt: skip
        extras = tuple(ExtraSpec.of(name, t) for name, t in sorted((extra or {}).items()))
        entry = self.add(key, page_ids=page_ids, token_ids=token_ids, checkpoints=checkpoints, extras=extras)
        if entry is None:
            return None
        slots = [slot for _, slot in sorted(checkpoints)]
        return self.copier.park(cache, block_ids=entry.block_ids, page_ids=page_ids[: entry.num_pages],
                                state_slots=slots, extras=extras, extra=extra, key=key)  # fmt: skip

    def unpark(
        self, key: Hashable, cache: ModelCache, *, page_ids: Sequence[int], state_slot: int,
        num_tokens: int | None = None, extra: Mapping[str, torch.Tensor] | None = None, keep: bool = False,
    ) -> ParkHandle:  # fmt: skip
        entry, index, num_pages = self.plan_unpark(key, num_tokens, len(page_ids))
        try:
            handle = self.copier.unpark(
                cache, block_ids=entry.block_ids, entry_num_pages=entry.num_pages, checkpoint_index=index,
                page_ids=page_ids[:num_pages], state_slot=state_slot, num_checkpoints=len(entry.checkpoints),
                extras=entry.extras, extra=extra, key=key,
            )  # fmt: skip
        except HostEntryMismatch:
            self.drop(key, "mismatch")
            raise
        self.finish_unpark(key, keep=keep, num_bytes=handle.num_bytes)
        return handle

    def stats(self) -> HostParkingStats:
        self.copier.poll()
        return dataclasses.replace(
            super().stats(),
            allocated_bytes=self.copier.slabs.allocated_bytes,
            park_seconds=self.copier.seconds["park"],
            restore_seconds=self.copier.seconds["unpark"],
        )
