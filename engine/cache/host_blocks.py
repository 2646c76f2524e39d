r"""HostBlockPool: the host-RAM budget of host parking, as fixed-size blocks carved out of slabs.

Owns: the host slabs (one torch uint8 tensor each: pinned on CUDA, plain memory on CPU) and which
blocks are free. Must not touch: device tensors, entries, tokens (`engine.cache.host` does that).

The budget is cut into blocks of `block_bytes`; blocks are grouped into independently allocated
slabs of `slab_bytes` (512 MiB by default), the last one holding whatever the budget leaves. A slab
is allocated the first time one of its blocks is handed out (or all at once with `allocate_slabs()`),
so an unused budget costs no RAM. An entry is a list of blocks, in any slabs, in any order:

    budget (num_blocks = budget // block_bytes)
    slab 0 (slab_bytes)                 slab 1 (slab_bytes)                 slab 2 (the rest)
    [ b0 | b1 | b2 | b3 | ... | b127 ]  [ b128 | b129 | ...      | b255 ]  [ b256 | ... | b299 ]
      \___ entry A ___/ free  \ B /       \ A (cont.) /  free ...

    block id = slab * blocks_per_slab + index in slab;  byte = index in slab * block_bytes

`allocate(n)` hands out the n lowest free ids, so an empty pool gives one physically contiguous run
per slab (`extents()` merges neighbours, and one extent is one host range of a copy), while
scattered free blocks stay usable: an entry never needs a contiguous fit, only `n` free blocks.
The cost of that freedom is internal fragmentation: at most one partly used block per entry.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import torch

MIB = 1 << 20
DEFAULT_SLAB_BYTES = 512 * MIB
DEFAULT_BLOCK_BYTES = 4 * MIB


@dataclass(frozen=True, slots=True)
class Extent:
    """Physically contiguous host bytes: `num_bytes` from byte `start` of slab `slab`."""

    slab: int
    start: int
    num_bytes: int


class HostBlockPool:
    def __init__(
        self, capacity_bytes: int, slab_bytes: int = DEFAULT_SLAB_BYTES,
        block_bytes: int = DEFAULT_BLOCK_BYTES, pin_memory: bool = False,
    ) -> None:  # fmt: skip
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes={capacity_bytes!r}: must be >= 0")
        if block_bytes < 1 or slab_bytes < block_bytes or slab_bytes % block_bytes:
            raise ValueError(
                f"slab_bytes={slab_bytes!r}, block_bytes={block_bytes!r}: a slab must be a whole number "
                "(>= 1) of blocks"
            )
        self.block_bytes = block_bytes
        self.slab_bytes = slab_bytes
        self.pin_memory = pin_memory
        self.blocks_per_slab = slab_bytes // block_bytes
        self.num_blocks = capacity_bytes // block_bytes
        self.num_slabs = -(-self.num_blocks // self.blocks_per_slab)
        self._slabs: list[torch.Tensor | None] = [None] * self.num_slabs
        self._free: list[int] = list(range(self.num_blocks))  # a heap: lowest id first
        self._is_free = bytearray(b"\x01") * self.num_blocks

    @property
    def capacity_bytes(self) -> int:
        return self.num_blocks * self.block_bytes

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def allocated_bytes(self) -> int:
        """Host RAM really allocated (slabs touched so far)."""
        return sum(s.numel() for s in self._slabs if s is not None)

    def blocks_for(self, num_bytes: int) -> int:
        return -(-num_bytes // self.block_bytes)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free)

    def allocate(self, num_blocks: int) -> list[int]:
        """The `num_blocks` lowest free block ids (ascending); allocates the slabs they lie in."""
        if num_blocks > len(self._free):
            raise RuntimeError(f"allocate({num_blocks}): only {len(self._free)} host blocks free")
        ids = [heapq.heappop(self._free) for _ in range(num_blocks)]
        for block_id in ids:
            self._is_free[block_id] = 0
        for slab in sorted({b // self.blocks_per_slab for b in ids}):
            if self._slabs[slab] is None:
                self._slabs[slab] = self._new_slab(slab)
        return ids

    def free(self, block_ids: Sequence[int]) -> None:
        for block_id in block_ids:
            if self._is_free[block_id]:
                raise RuntimeError(f"free(): host block {block_id} is already free")
            self._is_free[block_id] = 1
            heapq.heappush(self._free, block_id)

    def allocate_slabs(self) -> None:
        """Allocate every slab now (on CUDA, so that pinning never stalls a later park)."""
        for slab in range(self.num_slabs):
            if self._slabs[slab] is None:
                self._slabs[slab] = self._new_slab(slab)

    def _new_slab(self, slab: int) -> torch.Tensor:
        first = slab * self.blocks_per_slab
        num_bytes = (min(first + self.blocks_per_slab, self.num_blocks) - first) * self.block_bytes
        # NOTE: pinned memory needs CUDA; on CPU the same code runs on plain memory. torch's pinned
        # host allocator rounds a request up to a power of two, so a short last slab pins more RAM.
        return torch.empty(num_bytes, dtype=torch.uint8, pin_memory=self.pin_memory)

    def extents(self, block_ids: Sequence[int]) -> list[Extent]:
        """The blocks as physically contiguous runs, in list order (neighbours in one slab merge)."""
        out: list[Extent] = []
        bps, size = self.blocks_per_slab, self.block_bytes
        for block_id in block_ids:
            slab, start = divmod(block_id, bps)
            last = out[-1] if out else None
            if last is not None and last.slab == slab and last.start + last.num_bytes == start * size:
                out[-1] = Extent(slab, last.start, last.num_bytes + size)
            else:
                out.append(Extent(slab, start * size, size))
        return out

    def view(self, extent: Extent, offset: int, num_bytes: int) -> torch.Tensor:
        """`num_bytes` host bytes starting `offset` bytes into `extent` (a uint8 view, no copy)."""
        assert 0 <= offset and offset + num_bytes <= extent.num_bytes, "view outside the extent"
        slab = self._slabs[extent.slab]
        assert slab is not None, f"slab {extent.slab} is not allocated"
        return slab[extent.start + offset : extent.start + offset + num_bytes]

    def check_integrity(self, held: Sequence[int]) -> None:
        """`held` lists every block some entry owns; each must be held once, allocated, and the rest free."""
        held_set = set(held)
        if len(held_set) != len(held):
            raise RuntimeError(f"host blocks held twice: {len(held)} held, {len(held_set)} distinct")
        free_set = set(self._free)
        if len(free_set) != len(self._free):
            raise RuntimeError(
                f"host free heap has duplicates: {len(self._free)} entries, {len(free_set)} distinct"
            )
        if free_set & held_set:
            raise RuntimeError(f"host blocks both free and held: {sorted(free_set & held_set)[:8]}")
        if len(free_set) + len(held_set) != self.num_blocks:
            raise RuntimeError(
                f"{len(free_set)} free + {len(held_set)} held host blocks != {self.num_blocks} blocks"
            )
        num_flagged = sum(self._is_free)
        if num_flagged != len(free_set) or any(not self._is_free[b] for b in free_set):
            raise RuntimeError(
                f"host free flags ({num_flagged}) disagree with the free heap ({len(free_set)})"
            )
        unbacked = sorted(
            {b // self.blocks_per_slab for b in held_set if self._slabs[b // self.blocks_per_slab] is None}
        )
        if unbacked:
            raise RuntimeError(f"held host blocks lie in unallocated slabs {unbacked}")
