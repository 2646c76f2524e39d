"""The caches' bookkeeping and tensors: device KV pages, GDN state slots, hybrid prefix reuse, host parking.

Pure Python (no torch; the scheduler's side): pages.py (`PagePool`: page ids, ref counts, free list),
prefix.py (`PrefixIndex`: checkpoints, LRU), state.py (`StateSlotPool`). They decide which page and slot
ids hold what and never touch a tensor.
Torch: kv.py (`ModelCache`: the device KV pool and GDN state tensors, built from a `KVSpec`; the page-bytes
formula and the `--kv-capacity` page count), host.py / host_blocks.py / host_layout.py (host parking:
entries, pinned host blocks, the copies between them and the device cache).
The package imports nothing from the scheduler, the runner or the model (`.importlinter`).
"""

from engine.cache.pages import PagePool
from engine.cache.prefix import Checkpoint, PrefixIndex, PrefixMatch
from engine.cache.state import StateSlotPool

__all__ = ["Checkpoint", "PagePool", "PrefixIndex", "PrefixMatch", "StateSlotPool"]
