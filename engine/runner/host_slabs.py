"""HostSlabs: the host RAM of a host-parking budget (one torch uint8 tensor per slab), the runner's side.

Owns: the slab tensors (pinned on CUDA, plain memory on the CPU) and views into them. Must not touch:
which blocks are free or whose they are (the scheduler's `engine.cache.host_blocks.HostBlockPool`, from
the same `HostBudget`). A slab is allocated the first time a copy touches one of its blocks, or all at
once with `allocate_all()` (on CUDA at startup: pinning costs ~0.65 s per 512 MiB, measured on the H200
host, and must not land inside a step).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.cache.host_blocks import Extent, HostBudget


class HostSlabs:
    def __init__(self, budget: HostBudget, pin_memory: bool = False) -> None:
        self.budget = budget
        self.pin_memory = pin_memory
        self._slabs: list[torch.Tensor | None] = [None] * budget.num_slabs

    @property
    def allocated_bytes(self) -> int:
        """Host RAM really allocated (slabs touched so far)."""
        return sum(s.numel() for s in self._slabs if s is not None)

    def ensure(self, block_ids: Sequence[int]) -> None:
        """Allocate the slabs these blocks lie in."""
        for slab in sorted({self.budget.slab_of(b) for b in block_ids}):
            if self._slabs[slab] is None:
                self._slabs[slab] = self._new_slab(slab)

    def allocate_all(self) -> None:
        for slab in range(self.budget.num_slabs):
            if self._slabs[slab] is None:
                self._slabs[slab] = self._new_slab(slab)

    def _new_slab(self, slab: int) -> torch.Tensor:
        # NOTE: pinned memory needs CUDA; on CPU the same code runs on plain memory. torch's pinned
        # host allocator rounds a request up to a power of two, so a short last slab pins more RAM.
        return torch.empty(self.budget.slab_num_bytes(slab), dtype=torch.uint8, pin_memory=self.pin_memory)

    def view(self, extent: Extent, offset: int, num_bytes: int) -> torch.Tensor:
        """`num_bytes` host bytes starting `offset` bytes into `extent` (a uint8 view, no copy)."""
        assert 0 <= offset and offset + num_bytes <= extent.num_bytes, "view outside the extent"
        slab = self._slabs[extent.slab]
        assert slab is not None, f"slab {extent.slab} is not allocated"
        return slab[extent.start + offset : extent.start + offset + num_bytes]
