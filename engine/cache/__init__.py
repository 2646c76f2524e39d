"""Device KV page accounting, GDN state slots and hybrid prefix reuse (pure Python, no torch).

The tensors themselves (KV pool, GDN conv/recurrent state) belong to the runner's cache owner; this
package only decides which page ids and slot ids hold what. It imports nothing from the scheduler.
"""

from engine.cache.pages import PagePool
from engine.cache.prefix import Checkpoint, PrefixIndex, PrefixMatch
from engine.cache.state import StateSlotPool

__all__ = ["Checkpoint", "PagePool", "PrefixIndex", "PrefixMatch", "StateSlotPool"]
