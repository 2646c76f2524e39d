r"""HostPlanner: the scheduler's half of host parking (`--host-kv-cache-mib N`): what to park, what to restore.

Owns: the park / unpark lists of the step being built, the restore decisions, the restores in flight
and their counters; through `HostIndex` (engine/cache/host.py) the parked entries, their LRU, pins and
host blocks: every change to them is decided here, in the scheduler's thread of control.
Must not touch: bytes (the runner copies them, at the blocks named in each `HostPark` / `HostUnpark`,
through engine/runner/host_copies.py), device page / slot ownership (the scheduler allocates and frees
those).

Park on eviction. `PrefixIndex` calls `on_evict(cp, keep)` for every LRU victim (under the
checkpoint budget, for a state slot, or for pages reclaimed for an admission), just before freeing
its pages and slot. The index records the entry and its blocks at once (`HostIndex.add`, which may
evict older entries); the park is emitted in the next `StepPlan`, and nothing writes those ids before
the runner runs it, because the runner performs parks before anything else in a step:

    schedule()   reclaim -> evict cp (pages, slot freed) -> park queued -> pages re-allocated
    runner       parks (read cp's pages / slots) -> unparks -> page copies -> forward (writes)

What is parked: one entry per sequence, not one per checkpoint. A request leaves several checkpoints
on one sequence (message boundaries, its prompt end P, its generation end G); the next turn of a chat
usually continues from P, not G, because chat templates drop the previous turn's reasoning. Parking
each checkpoint as it falls out of the LRU would copy the same pages once per checkpoint and keep P
and G in different entries. So for a victim `cp` ("extends" = same tokens and the same physical full
pages, longer):

    no device checkpoint extends cp      park cp (a leaf: the end of a sequence)
    the ones that do form one chain,     evict them with cp and park ONE entry: the longest one's pages,
      all unpinned and not `keep`        the state of cp and of each of them (P with G)
    otherwise (branches, pinned, keep)   park nothing: cp's tokens stay on the device inside the longer
                                         checkpoints; a rewind to exactly cp re-prefills after that

Every entry also carries the states of the shorter device checkpoints on the same pages (branch
points: a later request can rewind there), and nothing is parked when the host already holds every
checkpoint of the entry (e.g. P, after G was parked together with it).

Restore on match. At admission the scheduler asks `match()` (a pure lookup) whether a parked entry
holds a longer prefix of the prompt than any device checkpoint. Only when it commits (pages and slot
allocated) does `restore()` pin the entry and emit the unpark into the lane's own pages and working
slot; the lane then starts at that checkpoint like a device prefix hit, with no state reset. Pages for
the restore come from `reclaim_pages`, which parks other idle retained sequences if needed (the
evicting restore); running lanes' pages and the pinned entry being restored are never touched.
Admission probes of a request that is not admitted therefore move no bytes.

Readiness. The restoring lane gets no row until the runner reports its copies complete
(`HostRestoreReport` in the `StepResult` handed to `Scheduler.commit`, which calls `finished`): other
lanes keep decoding while the bytes move. Only then is the entry unpinned and, unless it holds
checkpoints besides the restored one, freed. A failed restore (an entry that does not fit the cache or
is corrupt) drops the entry here and re-plans the lane as a cold prefill in the pages and slot it
already holds (`Scheduler._restore_failed`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence

from engine.cache.host import HostIndex, HostMatch
from engine.cache.prefix import Checkpoint, PrefixIndex, extend_page_hashes
from engine.step import HostPark, HostRestoreReport, HostUnpark


class HostPlanner:
    """Use: `match` during admission, `restore` once committed, `take` at the end of `schedule()`."""

    def __init__(self, host: HostIndex, prefix: PrefixIndex) -> None:
        if not host.enabled:
            raise ValueError("HostPlanner needs an enabled HostIndex (host_kv_cache_mib > 0)")
        self.host = host
        self.prefix = prefix
        prefix.keep_token_ids = True
        prefix.on_evict = self._on_evict
        self._parks: list[HostPark] = []
        self._unparks: list[HostUnpark] = []
        # request id -> (entry, keep it, demote it (first to evict), bytes)
        self._restoring: dict[str, tuple[Hashable, bool, bool, int]] = {}
        self.num_restores = 0  # committed restores (admissions)
        self.num_restored_tokens = 0  # prompt tokens they reused
        self.num_restore_failures = 0  # reported failed by the runner: the lane prefilled cold
        self.park_skips: Counter[str] = Counter()  # victims not parked: "covered" (on device), "on_host"
        self.num_co_evicted = 0  # later checkpoints evicted with a victim, in its entry

    # ---- park on eviction --------------------------------------------------------------------------
    def _on_evict(self, cp: Checkpoint, keep: Checkpoint | None) -> list[Checkpoint]:
        """Queue the park of `cp`'s sequence; return its later checkpoints to evict with it."""
        if cp.token_ids is None:  # inserted before parking was attached
            return []
        others = [o for o in self.prefix.checkpoints if o is not cp and o.token_ids is not None]
        later = sorted((o for o in others if self._extends(o, cp)), key=lambda o: o.num_tokens)
        chain = all(self._extends(b, a) for a, b in zip(later, later[1:], strict=False))
        if later and (not chain or any(o.num_pins or o is keep for o in later)):
            self.park_skips["covered"] += 1  # cp's tokens live on in longer device checkpoints
            return []
        group = [cp, *later]
        top = group[-1]
        shorter = [o for o in others if o not in group and self._extends(top, o)]
        checkpoints = sorted((c.num_tokens, c.state_slot) for c in group + shorter)
        assert top.token_ids is not None
        hashes: list[bytes] = []  # once for the whole entry: every checkpoint is a prefix of top
        extend_page_hashes(hashes, top.token_ids, top.num_tokens, self.prefix.page_size)
        if all(self._host_holds(top.token_ids, hashes, n) for n, _ in checkpoints):
            self.park_skips["on_host"] += 1
            return []
        entry = self.host.add(top.checkpoint_id, page_ids=top.page_ids, token_ids=top.token_ids,
                              checkpoints=checkpoints)  # fmt: skip
        if entry is not None:  # else refused (counted by the index): the sequence is simply lost
            slots = tuple(slot for _, slot in checkpoints)
            self._parks.append(HostPark(top.checkpoint_id, top.page_ids[: entry.num_pages], slots,
                                        tuple(entry.block_ids)))  # fmt: skip
        self.num_co_evicted += len(later)
        return later

    def _extends(self, longer: Checkpoint, shorter: Checkpoint) -> bool:
        """`longer` continues `shorter`: same first tokens, same physical full pages (so `shorter`'s
        state is valid with `longer`'s pages; a partial page of `shorter` was copied before writing)."""
        n = shorter.num_tokens
        full = n // self.prefix.page_size
        return (
            longer.num_tokens > n
            and longer.page_ids[:full] == shorter.page_ids[:full]
            and longer.token_ids is not None
            and longer.token_ids[:n] == shorter.token_ids
        )

    def _host_holds(self, token_ids: Sequence[int], page_hashes: Sequence[bytes], num_tokens: int) -> bool:
        found = self.host.lookup(token_ids, page_hashes, num_tokens)
        return found is not None and found.num_tokens == num_tokens

    # ---- restore on match ----------------------------------------------------------------------------
    def match(
        self, token_ids: Sequence[int], page_hashes: Sequence[bytes], max_tokens: int
    ) -> HostMatch | None:
        """The longest parked checkpoint <= max_tokens that prefixes `token_ids`. Moves nothing."""
        if len(self.host) == 0:
            return None
        return self.host.lookup(token_ids, page_hashes, max_tokens)

    def hold(self, match: HostMatch) -> None:
        """Keep `match`'s entry from eviction while an admission decides (no LRU move); `release` after."""
        self.host.pin(match.entry_key, touch=False)

    def release(self, match: HostMatch) -> None:
        self.host.unpin(match.entry_key)

    def restore(
        self, match: HostMatch, page_ids: Sequence[int], state_slot: int, request_id: str, lane: int
    ) -> None:
        """Commit: pin the entry and emit its unpark into `page_ids[:match.num_pages]` / `state_slot`."""
        entry, cp_index, num_pages = self.host.plan_unpark(match.entry_key, match.num_tokens, len(page_ids))
        assert isinstance(entry.key, int) and num_pages == match.num_pages, "stale host match"
        self.host.pin(entry.key)
        # Only the restored checkpoint's state comes back (into the lane's working slot, which moves on), so the
        # entry is kept while it holds others. Later ones (a rewind to an earlier turn: the branch not taken) go
        # first in line for eviction; earlier ones stay where they are: they are a resumed preemption's message
        # boundaries, where the session's next turn continues (freeing them made that turn prefill cold).
        later = match.num_tokens != entry.checkpoints[-1]
        keep = later or len(entry.checkpoints) > 1
        self._unparks.append(
            HostUnpark(
                entry.key,
                tuple(page_ids[:num_pages]),
                state_slot,
                match.num_tokens,
                tuple(entry.block_ids),
                entry.num_pages,
                cp_index,
                request_id,
                lane,
            )  # fmt: skip
        )
        self._restoring[request_id] = (entry.key, keep, later, match.num_bytes)
        self.num_restores += 1
        self.num_restored_tokens += match.num_tokens

    def finished(self, report: HostRestoreReport) -> None:
        """The runner reports a restore done (the entry is unpinned, counted, freed unless kept) or failed
        (the entry is dropped with the reported reason)."""
        restoring = self._restoring.pop(report.request_id, None)
        assert restoring is not None, f"host restore report for {report.request_id!r}, which restores nothing"
        key, keep, demote, num_bytes = restoring
        if report.ok:
            self.host.finish_unpark(key, keep=keep, demote=demote, num_bytes=num_bytes)
        elif key in self.host:
            self.host.unpin(key)
            self.host.drop(key, report.drop_reason or "corrupt")

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
        """The host index's own check, and every pin matches a restore not yet reported complete."""
        self.host.check_integrity()
        want: Counter[Hashable] = Counter(key for key, _, _, _ in self._restoring.values())
        for key in self.host.entry_keys:
            pins = self.host.entry(key).num_pins
            if pins != want[key]:
                raise RuntimeError(f"host entry {key!r}: {pins} pins, {want[key]} restores in flight")
