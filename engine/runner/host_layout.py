r"""Host parking's copies, planned: the cache tensors in entry order, their geometry, and `CopyPlan`.

Owns: the mapping between device cache tensors (`ModelCache`: paged K/V (+ int8 scales) per attention
layer incl. MTP, GDN conv / recurrent state per slot) and the logical byte stream of one host entry
(layout in engine/cache/host_layout.py), and the split of that stream into copies at host extent edges.
Must not touch: which blocks are free, the LRU, tokens (the scheduler's `engine.cache.host`), or the
device page / slot ids' ownership. All copies are raw bytes through uint8 views (bit-exact by
construction, any dtype).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.cache.host_blocks import Extent
from engine.cache.host_layout import CacheGeometry, ExtraSpec, TensorSpec
from engine.cache.kv import ModelCache

if TYPE_CHECKING:
    from engine.runner.host_slabs import HostSlabs


def paged_tensors(cache: ModelCache) -> list[torch.Tensor]:
    """Every tensor indexed by page id, in layout order: K, V (and int8 K/V scales) per KV entry."""
    out: list[torch.Tensor] = []
    for i in range(len(cache.key_cache)):
        out += [cache.key_cache[i], cache.value_cache[i]]
        if cache.key_scale is not None and cache.value_scale is not None:
            out += [cache.key_scale[i], cache.value_scale[i]]
    return out


def state_tensors(cache: ModelCache) -> list[torch.Tensor]:
    """Every tensor indexed by state slot, in layout order: conv, recurrent per GDN layer, then the slot
    extras (the MTP continuation hidden state under `--spec mtp`)."""
    out: list[torch.Tensor] = []
    for conv, rec in zip(cache.conv_state, cache.recurrent_state, strict=True):
        out += [conv, rec]
    return out + list(cache.slot_extras)


def _spec(t: torch.Tensor) -> TensorSpec:
    return str(t.dtype), tuple(t.shape[1:])


def row_bytes(t: torch.Tensor) -> int:
    return t[0].numel() * t.element_size() if t.shape[0] else 0


def flat_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor as a flat uint8 view of its storage (no copy)."""
    if not t.is_contiguous():
        raise ValueError(
            f"host parking copies raw bytes and needs contiguous tensors, got strides {t.stride()}"
        )
    return t.reshape(-1).view(torch.uint8)


def cache_geometry(cache: ModelCache) -> CacheGeometry:
    """The geometry of `cache`: what an entry parked from it must match to be restored into it."""
    paged, state = paged_tensors(cache), state_tensors(cache)
    return CacheGeometry(
        page_size=cache.page_size,
        paged=tuple(_spec(t) for t in paged),
        state=tuple(_spec(t) for t in state),
        page_bytes=tuple(row_bytes(t) for t in paged),
        state_bytes=tuple(row_bytes(t) for t in state),
    )


def page_runs(page_ids: Sequence[int]) -> list[tuple[int, int, int]]:
    """Maximal runs of consecutive ascending page ids: (index into page_ids, first page id, length).

    >>> page_runs([4, 5, 6, 9, 2, 3])
    [(0, 4, 3), (3, 9, 1), (4, 2, 2)]
    """
    runs: list[tuple[int, int, int]] = []
    for i, page_id in enumerate(page_ids):
        if runs and runs[-1][1] + runs[-1][2] == page_id:
            start, first, length = runs[-1]
            runs[-1] = (start, first, length + 1)
        else:
            runs.append((i, page_id, 1))
    return runs


@dataclass(frozen=True, slots=True)
class _Gather:
    """Scattered device pages <-> contiguous host bytes through a device staging buffer (one chunk)."""

    pages: torch.Tensor  # [num_pages, page_bytes] uint8 view of one paged tensor
    page_ids: tuple[int, ...]
    pieces: tuple[tuple[torch.Tensor, int, int], ...]  # (host view, staging offset, bytes)


class CopyPlan:
    """The copies between device tensors and one entry's host blocks, split at host extent edges.

    `to_host=True` (park): host <- device; False (unpark): device <- host. Page runs shorter than
    `gather_run_bytes` on average go through a device staging buffer of at most `staging_bytes`
    (`index_select` then one host copy per extent on park; one host copy then `index_copy_` on
    unpark): PCIe copies of a single page are too small to reach the link's bandwidth, and issuing
    one per page per layer costs more host time than the copy itself.
    """

    def __init__(
        self, slabs: HostSlabs, block_ids: Sequence[int], to_host: bool, gather_run_bytes: int = 0,
        staging_bytes: int = 64 << 20,
    ) -> None:  # fmt: skip
        self._slabs = slabs
        self._extents = slabs.budget.extents(block_ids)
        self._starts: list[int] = []
        pos = 0
        for ext in self._extents:
            self._starts.append(pos)
            pos += ext.num_bytes
        self.to_host = to_host
        self.gather_run_bytes = gather_run_bytes
        self.staging_bytes = staging_bytes
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []  # (dst, src)
        self.gathers: list[_Gather] = []
        self.num_bytes = 0

    @property
    def num_copies(self) -> int:
        """Host <-> device copy calls."""
        return len(self.pairs) + sum(len(g.pieces) for g in self.gathers)

    def _host_pieces(self, logical: int, num_bytes: int) -> list[tuple[torch.Tensor, int, int]]:
        """Logical bytes [logical, logical + num_bytes) as (host view, offset in the range, bytes)."""
        out: list[tuple[torch.Tensor, int, int]] = []
        i = bisect_right(self._starts, logical) - 1
        done = 0
        while done < num_bytes:
            ext: Extent = self._extents[i]
            offset = logical + done - self._starts[i]
            n = min(ext.num_bytes - offset, num_bytes - done)
            out.append((self._slabs.view(ext, offset, n), done, n))
            done += n
            i += 1
        return out

    def add(self, logical: int, device: torch.Tensor) -> None:
        """Copy the flat uint8 `device` range to/from logical bytes [logical, logical + device.numel())."""
        for host, offset, n in self._host_pieces(logical, device.numel()):
            dev = device[offset : offset + n]
            self.pairs.append((host, dev) if self.to_host else (dev, host))
        self.num_bytes += device.numel()

    def add_pages(
        self, geometry: CacheGeometry, paged: Sequence[torch.Tensor], num_pages: int, page_ids: Sequence[int]
    ) -> int:
        """Entry pages 0..len(page_ids)-1 <-> device `page_ids` of every paged tensor; returns the runs.

        `num_pages` is the entry's page count (the stride between tensors in the entry's bytes).
        """
        runs = page_runs(page_ids)
        base = 0
        for t, page_bytes in zip(paged, geometry.page_bytes, strict=True):
            flat = flat_bytes(t)
            if runs and len(page_ids) * page_bytes < self.gather_run_bytes * len(runs):
                self._add_gathers(flat.view(-1, page_bytes), base, page_ids)
            else:
                for index, first, length in runs:
                    self.add(
                        base + index * page_bytes, flat[first * page_bytes : (first + length) * page_bytes]
                    )
            base += num_pages * page_bytes
        return len(runs)

    def _add_gathers(self, pages: torch.Tensor, logical: int, page_ids: Sequence[int]) -> None:
        page_bytes = pages.shape[1]
        chunk = max(1, self.staging_bytes // page_bytes)
        for start in range(0, len(page_ids), chunk):
            ids = tuple(page_ids[start : start + chunk])
            pieces = self._host_pieces(logical + start * page_bytes, len(ids) * page_bytes)
            self.gathers.append(_Gather(pages, ids, tuple(pieces)))
            self.num_bytes += len(ids) * page_bytes

    def add_state(
        self, geometry: CacheGeometry, state: Sequence[torch.Tensor], logical: int, slot: int
    ) -> None:
        """One checkpoint's state rows (slot `slot` of every state tensor) <-> logical bytes from `logical`."""
        for t, nbytes in zip(state, geometry.state_bytes, strict=True):
            self.add(logical, flat_bytes(t)[slot * nbytes : (slot + 1) * nbytes])
            logical += nbytes

    def add_extras(
        self, specs: Sequence[ExtraSpec], logical: int, tensors: Mapping[str, torch.Tensor]
    ) -> None:
        for spec in specs:
            t = tensors[spec.name]
            spec.check(t)
            self.add(logical, flat_bytes(t))
            logical += spec.num_bytes

    def execute(self, non_blocking: bool) -> None:
        """Issue every copy on the current stream (staging buffers come from, and go back to, it)."""
        for dst, src in self.pairs:
            dst.copy_(src, non_blocking=non_blocking)
        for g in self.gathers:
            index = torch.tensor(g.page_ids, dtype=torch.int64).to(g.pages.device, non_blocking=non_blocking)
            if self.to_host:
                staging = g.pages.index_select(0, index).view(-1)
                for host, offset, n in g.pieces:
                    host.copy_(staging[offset : offset + n], non_blocking=non_blocking)
            else:
                staging = torch.empty(
                    len(g.page_ids) * g.pages.shape[1], dtype=torch.uint8, device=g.pages.device
                )
                for host, offset, n in g.pieces:
                    staging[offset : offset + n].copy_(host, non_blocking=non_blocking)
                g.pages.index_copy_(0, index, staging.view(len(g.page_ids), -1))
