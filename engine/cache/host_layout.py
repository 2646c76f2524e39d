r"""What a parked entry's bytes are: the cache geometry an entry must match, and its opaque extras.
Pure Python (no torch at run time): the scheduler's side reads these numbers; the runner's
engine/runner/host_layout.py measures them from the cache tensors and splits an entry into copies.

An entry's logical bytes are layer-major, so a run of consecutive device page ids in one tensor is
one contiguous logical range (one copy per host extent it touches):

    logical  0                                                                        num_bytes
             [ T0: pages 0..P-1 | T1: pages 0..P-1 | ... | cp 0: S0 S1 ... | cp 1: ... | extras ]
               T = paged tensors in order K0 V0 (Ks0 Vs0) K1 V1 ...;  S = state rows conv0 rec0 conv1 rec1 ...
    blocks   [ block_ids[0] | block_ids[1] | ....................................... | last (tail unused) ]

Must not touch: which blocks are free, the LRU, tokens (`engine.cache.host`), tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

TensorSpec = tuple[str, tuple[int, ...]]  # (dtype, shape of one page or one state slot)


@dataclass(frozen=True, slots=True)
class CacheGeometry:
    """The shape of one page and one state slot of a cache: what an entry must match to be restored."""

    page_size: int
    paged: tuple[TensorSpec, ...]
    state: tuple[TensorSpec, ...]
    page_bytes: tuple[int, ...]  # per paged tensor, one page
    state_bytes: tuple[int, ...]  # per state tensor, one slot

    @property
    def bytes_per_page(self) -> int:
        """Host bytes of one page across every paged tensor."""
        return sum(self.page_bytes)

    @property
    def bytes_per_checkpoint(self) -> int:
        """Host bytes of one GDN state snapshot (every GDN layer's conv + recurrent row)."""
        return sum(self.state_bytes)

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def entry_bytes(self, num_pages: int, num_checkpoints: int, extra_bytes: int = 0) -> int:
        return num_pages * self.bytes_per_page + num_checkpoints * self.bytes_per_checkpoint + extra_bytes


@dataclass(frozen=True, slots=True)
class ExtraSpec:
    """An opaque extra tensor of an entry (e.g. the MTP hidden state), copied whole as raw bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    num_bytes: int

    @classmethod
    def of(cls, name: str, t: torch.Tensor) -> ExtraSpec:
        return cls(name, str(t.dtype), tuple(t.shape), t.numel() * t.element_size())

    def check(self, t: torch.Tensor) -> None:
        if (str(t.dtype), tuple(t.shape)) != (self.dtype, self.shape):
            raise ValueError(
                f"extra {self.name!r}: parked as {self.dtype}{list(self.shape)}, got {t.dtype}{list(t.shape)}"
            )
