"""The caches' bookkeeping and tensors: device KV pages, GDN state slots, hybrid prefix reuse, host parking.

Pure Python (no torch; the scheduler's side): pages.py (`PagePool`: page ids, ref counts, free list),
prefix.py (`PrefixIndex`: checkpoints, LRU), state.py (`StateSlotPool`), and host parking's index:
host.py (`HostIndex`: parked entries, LRU, pins, decisions), host_blocks.py (`HostBudget`,
`HostBlockPool`: which host blocks are free), host_layout.py (`CacheGeometry`: what an entry's bytes
are). They decide which page, slot and block ids hold what and never touch a tensor.
Torch: kv.py only (`ModelCache`: the device KV pool and GDN state tensors, built from a `KVSpec`; the
page-bytes formula and the `--kv-capacity` page count). The host copies themselves are the runner's
(engine/runner/host_copier.py).
The package imports nothing from the scheduler, the runner or the model (`.importlinter`).
"""

from engine.cache.pages import PagePool
from engine.cache.prefix import Checkpoint, PrefixIndex, PrefixMatch
from engine.cache.state import StateSlotPool

__all__ = ["Checkpoint", "PagePool", "PrefixIndex", "PrefixMatch", "StateSlotPool"]
