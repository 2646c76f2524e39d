r"""The host-RAM budget of host parking as fixed-size blocks in slabs: its shape (`HostBudget`) and which
blocks are free (`HostBlockPool`). Pure Python, no torch: the scheduler's side.

Owns: block ids and whether each is free. Must not touch: the slab memory itself (the runner's
`engine.runner.host_slabs.HostSlabs` allocates, pins and reads it, from the same `HostBudget`), device
tensors, entries, tokens (`engine.cache.host` does that).

The budget is cut into blocks of `block_bytes`; blocks are grouped into independently allocated
slabs of `slab_bytes` (512 MiB by default), the last one holding whatever the budget leaves. The
runner allocates a slab the first time a copy touches one of its blocks (or all at once at startup on
CUDA), so an unused budget costs no RAM. An entry is a list of blocks, in any slabs, in any order:

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

MIB = 1 << 20
DEFAULT_SLAB_BYTES = 512 * MIB
DEFAULT_BLOCK_BYTES = 4 * MIB


@dataclass(frozen=True, slots=True)
class Extent:
    """Physically contiguous host bytes: `num_bytes` from byte `start` of slab `slab`."""

    slab: int
    start: int
    num_bytes: int


@dataclass(frozen=True, slots=True)
class HostBudget:
    """The shape of a host budget: `capacity_bytes` cut into blocks, grouped into slabs (plain numbers that
    the scheduler's `HostBlockPool` and the runner's slabs both read)."""

    capacity_bytes: int
    slab_bytes: int = DEFAULT_SLAB_BYTES
    block_bytes: int = DEFAULT_BLOCK_BYTES

    def __post_init__(self) -> None:
        if self.capacity_bytes < 0:
            raise ValueError(f"capacity_bytes={self.capacity_bytes!r}: must be >= 0")
        if self.block_bytes < 1 or self.slab_bytes < self.block_bytes or self.slab_bytes % self.block_bytes:
            raise ValueError(
                f"slab_bytes={self.slab_bytes!r}, block_bytes={self.block_bytes!r}: a slab must be a whole "
                "number (>= 1) of blocks"
            )

    @classmethod
    def from_mib(cls, host_kv_cache_mib: int) -> HostBudget:
        """The `--host-kv-cache-mib N` budget (0 = off). Blocks of 4 MiB, halved (down to 4 KiB) until the
        budget holds 256 blocks, so small budgets (tests, tiny models) are not lost to one partly used
        block per entry."""
        if host_kv_cache_mib < 0:
            raise ValueError(f"host_kv_cache_mib={host_kv_cache_mib!r}: must be >= 0 (0 = off)")
        block = DEFAULT_BLOCK_BYTES
        while block > 4096 and host_kv_cache_mib * MIB // block < 256:
            block //= 2
        return cls(host_kv_cache_mib * MIB, block_bytes=block)

    @property
    def num_blocks(self) -> int:
        return self.capacity_bytes // self.block_bytes

    @property
    def blocks_per_slab(self) -> int:
        return self.slab_bytes // self.block_bytes

    @property
    def num_slabs(self) -> int:
        return -(-self.num_blocks // self.blocks_per_slab)

    def slab_of(self, block_id: int) -> int:
        return block_id // self.blocks_per_slab

    def slab_num_bytes(self, slab: int) -> int:
        """Bytes of slab `slab` (the last one holds what the budget leaves)."""
        first = slab * self.blocks_per_slab
        return (min(first + self.blocks_per_slab, self.num_blocks) - first) * self.block_bytes

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


class HostBlockPool:
    """Which blocks of a `HostBudget` are free. `allocate(n)` hands out the n lowest free ids."""

    def __init__(self, budget: HostBudget) -> None:
        self.budget = budget
        self.block_bytes = budget.block_bytes
        self.num_blocks = budget.num_blocks
        self.num_slabs = budget.num_slabs
        self._free: list[int] = list(range(self.num_blocks))  # a heap: lowest id first
        self._is_free = bytearray(b"\x01") * self.num_blocks

    @property
    def capacity_bytes(self) -> int:
        return self.num_blocks * self.block_bytes

    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_for(self, num_bytes: int) -> int:
        return -(-num_bytes // self.block_bytes)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free)

    def allocate(self, num_blocks: int) -> list[int]:
        """The `num_blocks` lowest free block ids (ascending)."""
        if num_blocks > len(self._free):
            raise RuntimeError(f"allocate({num_blocks}): only {len(self._free)} host blocks free")
        ids = [heapq.heappop(self._free) for _ in range(num_blocks)]
        for block_id in ids:
            self._is_free[block_id] = 0
        return ids

    def free(self, block_ids: Sequence[int]) -> None:
        for block_id in block_ids:
            if self._is_free[block_id]:
                raise RuntimeError(f"free(): host block {block_id} is already free")
            self._is_free[block_id] = 1
            heapq.heappush(self._free, block_id)

    def extents(self, block_ids: Sequence[int]) -> list[Extent]:
        return self.budget.extents(block_ids)

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
