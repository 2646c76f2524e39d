r"""HostPlanner: the scheduler's half of host parking (`--host-kv-cache-mib N`): what to park, what to restore.

Owns: the park / unpark lists of the step being built, the restore decisions and their counters.
Must not touch: bytes (the runner executes the lists through `engine.parking`), device page / slot
ownership (the scheduler allocates and frees those), `HostParking`'s entries (only the runner's
`park` / `unpark` change them; here they are read with `lookup` and pinned).

Park on eviction. `PrefixIndex` calls `on_evict(cp)` for every checkpoint it evicts (the LRU under
the checkpoint budget, a state slot, or pages reclaimed for an admission), just before freeing its
pages and slot. The park is emitted in the next `SchedulerOutput`; nothing writes those ids before
the runner runs it, because the runner performs parks before anything else in a step:

    schedule()   reclaim -> evict cp (pages, slot freed) -> park queued -> pages re-allocated
    runner       parks (read cp's pages / slots) -> unparks -> page copies -> forward (writes)

Earlier checkpoints of the same sequence that are still on the device (same physical pages, same
tokens) are copied into the same entry as earlier checkpoints, so a later request can branch there.

Restore on match. At admission the scheduler asks `match()` (a pure lookup) whether a parked entry
holds a longer prefix of the prompt than any device checkpoint. Only when it commits (pages and slot
allocated) does `restore()` pin the entry and emit the unpark into the lane's own pages and working
slot; the lane then starts at that checkpoint like a device prefix hit, with no state reset. Pages for
the restore come from `reclaim_pages`, which parks other idle retained sequences if needed (the
evicting restore); running lanes' pages and the pinned entry being restored are never touched.
Admission probes of a request that is not admitted therefore move no bytes.

Readiness. The restoring lane gets no row until the runner reports its copies complete
(`HostRestoreReport` in `Scheduler.commit`): other lanes keep decoding while the bytes move. A failed
restore (a corrupt or mismatched entry, dropped by the runner) re-plans the lane as a cold prefill in
the pages and slot it already holds (`Scheduler._restore_failed`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence

from engine.cache.host import HostMatch, HostParking
from engine.cache.prefix import Checkpoint, PrefixIndex
from engine.scheduler.output import HostPark, HostUnpark


class HostPlanner:
    """Use: `match` during admission, `restore` once committed, `take` at the end of `schedule()`."""

    def __init__(self, host: HostParking, prefix: PrefixIndex) -> None:
        if not host.enabled:
            raise ValueError("HostPlanner needs an enabled HostParking (host_kv_cache_mib > 0)")
        self.host = host
        self.prefix = prefix
        prefix.keep_token_ids = True
        prefix.on_evict = self._on_evict
        self._parks: list[HostPark] = []
        self._unparks: list[HostUnpark] = []
        self.num_restores = 0  # committed restores (admissions)
        self.num_restored_tokens = 0  # prompt tokens they reused
        self.num_restore_failures = 0  # reported failed by the runner: the lane prefilled cold

    # ---- park on eviction --------------------------------------------------------------------------
    def _on_evict(self, cp: Checkpoint) -> None:
        tokens = cp.token_ids
        if tokens is None:  # inserted before parking was attached
            return
        checkpoints = [(cp.num_tokens, cp.state_slot)]
        for other in self.prefix.checkpoints:
            if (other is not cp and other.num_tokens < cp.num_tokens
                    and other.page_ids == cp.page_ids[: len(other.page_ids)]
                    and other.token_ids == tokens[: other.num_tokens]):  # fmt: skip
                checkpoints.append((other.num_tokens, other.state_slot))
        self._parks.append(HostPark(cp.checkpoint_id, cp.page_ids, tokens, tuple(sorted(checkpoints))))

    # ---- restore on match ----------------------------------------------------------------------------
    def match(
        self, token_ids: Sequence[int], page_hashes: Sequence[bytes], max_tokens: int
    ) -> HostMatch | None:
        """The longest parked checkpoint <= max_tokens that prefixes `token_ids`. Moves nothing."""
        if len(self.host) == 0:
            return None
        return self.host.lookup(token_ids, page_hashes, max_tokens)

    def restore(
        self, match: HostMatch, page_ids: Sequence[int], state_slot: int, request_id: str, lane: int
    ) -> None:
        """Commit: pin the entry and emit its unpark into `page_ids[:match.num_pages]` / `state_slot`."""
        entry = self.host.entry(match.entry_key)
        assert isinstance(entry.key, int) and match.num_tokens in entry.checkpoints, "stale host match"
        self.host.pin(entry.key)
        # Restoring an earlier checkpoint keeps the entry: its later ones may still be wanted (branching).
        keep = match.num_tokens != entry.checkpoints[-1]
        pages = tuple(page_ids[: match.num_pages])
        self._unparks.append(
            HostUnpark(entry.key, pages, state_slot, match.num_tokens, keep, request_id, lane)
        )
        self.num_restores += 1
        self.num_restored_tokens += match.num_tokens

    def failed(self, num_tokens: int) -> None:
        """A committed restore of `num_tokens` failed in the runner (the lane now prefills cold)."""
        self.num_restores -= 1
        self.num_restored_tokens -= num_tokens
        self.num_restore_failures += 1

    # ---- step output ------------------------------------------------------------------------------------
    def has_pending(self) -> bool:
        """Parks queued since the last `take` (e.g. by an eviction at commit) still need a step."""
        return bool(self._parks or self._unparks)

    def take(self) -> tuple[tuple[HostPark, ...], tuple[HostUnpark, ...]]:
        parks, unparks = tuple(self._parks), tuple(self._unparks)
        self._parks.clear()
        self._unparks.clear()
        return parks, unparks

    def check_integrity(self) -> None:
        """The host budget's own check, and every pin matches an unpark not yet executed."""
        self.host.check_integrity()
        want: Counter[Hashable] = Counter(u.key for u in self._unparks)
        for key in self.host.entry_keys:
            pins = self.host.entry(key).num_pins
            if pins != want[key]:
                raise RuntimeError(f"host entry {key!r}: {pins} pins, {want[key]} pending unparks")
