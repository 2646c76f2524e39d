r"""HostIndex: the entries parked in host RAM (`--host-kv-cache-mib N`), the scheduler's side of host parking.

Owns: the parked entries (identity, host blocks, LRU order, pins), the budget's free blocks
(`HostBlockPool`), the decisions (what fits, what to evict, which blocks an entry gets) and the counts.
Pure Python, no torch. Must not touch: bytes (the runner's `engine.runner.host_copier.HostCopier` copies
them, at the blocks named in each `HostPark` / `HostUnpark`), requests, lanes, device page / slot ownership.

An entry is everything needed to continue a sequence: the KV pages it really uses (every attention
layer incl. MTP, int8 scales too), one GDN state snapshot (conv + recurrent of every GDN layer) per
checkpoint, optional opaque extras (the MTP hidden state), and its prefix identity as plain Python
data (token ids + checkpoint positions + chained page hashes). It lives in fixed-size host blocks
from any slabs (`host_blocks`), laid out layer-major (`host_layout`):

    host budget  [ slab 0: A A A B B . . C ][ slab 1: C C A A . . . . ][ slab 2: . . B ]
                   (. = free block; an entry is any set of blocks, so scattered space is usable)
    entry A      token_ids t0 ... t(L-1), checkpoints (L1, L2=L): state snapshot per checkpoint
                 bytes [ K0 V0 K1 V1 ... pages 0..ceil(L/page_size)-1 | state L1 | state L2 | extras ]

Matching follows device prefix reuse (`engine.cache.prefix`): the longest checkpoint L whose chained
page hash (16-byte blake2b, treated as a token match) and < page_size tail tokens equal the request's,
so a request that rewinds to an earlier turn branches from that turn's checkpoint. A restore of
checkpoint L copies only ceil(L / page_size) pages and that checkpoint's state, into ANY free pages
and slot: kernels read KV through the page table, so physical ids do not matter.

Who calls what (engine loop, one thread; all from the scheduler's `HostPlanner`):
  `lookup`, `can_park`, `can_restore`   pure: nothing moves, LRU untouched;
  `add`                                 a park decided: evict LRU entries, take blocks, record the entry
                                        (the runner then copies into those blocks, before anything else);
  `pin`, `plan_unpark`                  a restore decided: the entry cannot be evicted until
  `finish_unpark`                       the runner reports the copy complete: unpin, count, and free the
                                        entry (its bytes are on the device again) unless kept or pinned;
  `drop`                                the runner reported the entry unusable (mismatch, corrupt).
Blocks freed here are rewritten only by later copies on the runner's one FIFO copy stream.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from engine.cache.host_blocks import HostBlockPool, HostBudget
from engine.cache.host_layout import CacheGeometry, ExtraSpec
from engine.cache.prefix import extend_page_hashes

# Why entries leave the index other than by a restore (`drop`): "lru" (evicted for a new park's blocks),
# "replaced" (parked again under its key), "mismatch" / "corrupt" (the runner could not restore it). The
# `/stats` `host_kv_evictions` keys; monitor/metrics.py pre-creates the same label values.
EVICTION_REASONS = ("lru", "replaced", "mismatch", "corrupt")


@dataclass(slots=True, eq=False)
class HostEntry:
    key: Hashable
    token_ids: tuple[int, ...]  # [0, checkpoints[-1])
    checkpoints: tuple[int, ...]  # ascending positions L with a saved state; the last is len(token_ids)
    page_hashes: tuple[bytes, ...]  # chained hashes of the full pages of token_ids
    num_pages: int  # ceil(len(token_ids) / page_size)
    extras: tuple[ExtraSpec, ...]
    num_bytes: int
    block_ids: list[int]
    num_pins: int = 0  # restores decided and not yet reported complete: never evicted while > 0


@dataclass(frozen=True, slots=True)
class HostMatch:
    entry_key: Hashable
    num_tokens: int  # the matched checkpoint L
    num_pages: int  # pages a restore of L needs
    num_bytes: int  # bytes a restore of L copies


@dataclass(frozen=True, slots=True)
class HostParkingStats:
    """Plain numbers for /stats and metrics (the engine never imports monitor)."""

    enabled: bool
    capacity_bytes: int
    used_bytes: int  # payload of the parked entries
    reserved_bytes: int  # blocks they hold (used + the unused tail of each entry's last block)
    allocated_bytes: int  # host RAM really allocated (slabs touched so far; the runner's copier knows)
    num_entries: int
    num_parks: int
    num_restores: int
    park_bytes: int
    restore_bytes: int
    park_seconds: float  # completed copies only (the runner's copier knows)
    restore_seconds: float
    evictions: dict[str, int] = field(default_factory=dict)  # reason -> count
    refusals: dict[str, int] = field(default_factory=dict)  # park refused, reason -> count


class HostIndex:
    """Entries in a host budget, whole-entry LRU. A budget of 0 bytes: off."""

    def __init__(self, geometry: CacheGeometry, budget: HostBudget) -> None:
        self.geometry = geometry
        self.page_size = geometry.page_size
        self.budget = budget
        self.blocks = HostBlockPool(budget)
        self._lru: OrderedDict[Hashable, HostEntry] = OrderedDict()  # oldest first
        self._used_bytes = 0
        self._counts: Counter[str] = Counter()  # parks, restores, park_bytes, restore_bytes
        self._evictions: Counter[str] = Counter()
        self._refusals: Counter[str] = Counter()

    @property
    def enabled(self) -> bool:
        return self.blocks.num_blocks > 0

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, entry_key: Hashable) -> bool:
        return entry_key in self._lru

    def entry(self, entry_key: Hashable) -> HostEntry:
        try:
            return self._lru[entry_key]
        except KeyError:
            raise ValueError(f"no parked entry {entry_key!r}") from None

    @property
    def entry_keys(self) -> list[Hashable]:
        """Keys in LRU order, oldest first (the next eviction first)."""
        return list(self._lru)

    # ---- side-effect-free checks ------------------------------------------------------------------
    def lookup(
        self,
        token_ids: Sequence[int],
        page_hashes: Sequence[bytes] | None = None,
        max_tokens: int | None = None,
    ) -> HostMatch | None:
        """The longest parked checkpoint L <= max_tokens with identity `token_ids[:L]`. Moves nothing.

        `page_hashes` (the scheduler's `extend_page_hashes` list for these tokens) saves rehashing;
        ties go to the most recently used entry. The LRU order changes only through `touch`.
        """
        max_tokens = len(token_ids) if max_tokens is None else min(max_tokens, len(token_ids))
        if not self._lru or max_tokens < 1:
            return None
        if page_hashes is None:
            hashes: list[bytes] = []
            extend_page_hashes(hashes, token_ids, max_tokens, self.page_size)
            page_hashes = hashes
        assert len(page_hashes) >= max_tokens // self.page_size, "page_hashes do not cover max_tokens"
        best: tuple[HostEntry, int] | None = None
        for entry in self._lru.values():  # oldest first: a later equal match wins
            for num_tokens in reversed(entry.checkpoints):
                if best is not None and num_tokens < best[1]:
                    break
                if num_tokens <= max_tokens and self._matches(entry, num_tokens, token_ids, page_hashes):
                    best = (entry, num_tokens)
                    break
        if best is None:
            return None
        entry, num_tokens = best
        num_pages = self.geometry.pages_for(num_tokens)
        return HostMatch(entry.key, num_tokens, num_pages, self._restore_bytes(entry, num_pages))

    def _matches(
        self, entry: HostEntry, num_tokens: int, token_ids: Sequence[int], page_hashes: Sequence[bytes]
    ) -> bool:
        num_full = num_tokens // self.page_size
        if num_full and page_hashes[num_full - 1] != entry.page_hashes[num_full - 1]:
            return False
        start = num_full * self.page_size
        return tuple(token_ids[start:num_tokens]) == entry.token_ids[start:num_tokens]

    def _restore_bytes(self, entry: HostEntry, num_pages: int) -> int:
        return self.geometry.entry_bytes(num_pages, 1, sum(s.num_bytes for s in entry.extras))

    def can_park(self, num_pages: int, num_checkpoints: int = 1, extra_bytes: int = 0,
                 replacing: Hashable | None = None) -> bool:  # fmt: skip
        """Whether `park` of an entry this size would succeed (evicting unpinned LRU entries)."""
        return (
            self._park_refusal(self.geometry.entry_bytes(num_pages, num_checkpoints, extra_bytes), replacing)
            is None
        )

    def _park_refusal(self, num_bytes: int, replacing: Hashable | None) -> str | None:
        if not self.enabled:
            return "off"
        need = self.blocks.blocks_for(num_bytes)
        if need > self.blocks.num_blocks:
            return "oversize"  # larger than the whole budget: the caller re-prefills instead
        old = self._lru.get(replacing) if replacing is not None else None
        if old is not None and old.num_pins:
            return "pinned"
        evictable = sum(len(e.block_ids) for e in self._lru.values() if e.num_pins == 0)
        if need > self.blocks.num_free + evictable:
            return "pinned"  # the budget is held by entries with scheduled restores
        return None

    def can_restore(self, entry_key: Hashable, num_tokens: int | None = None) -> bool:
        entry = self._lru.get(entry_key)
        return entry is not None and (num_tokens is None or num_tokens in entry.checkpoints)

    # ---- LRU and pins --------------------------------------------------------------------------------
    def touch(self, entry_key: Hashable) -> None:
        """Commit a lookup: make the entry the most recently used."""
        self._lru.move_to_end(self.entry(entry_key).key)

    def pin(self, entry_key: Hashable, *, touch: bool = True) -> None:
        self.entry(entry_key).num_pins += 1
        if touch:
            self.touch(entry_key)

    def unpin(self, entry_key: Hashable) -> None:
        entry = self.entry(entry_key)
        assert entry.num_pins > 0, f"host entry {entry_key!r} unpinned more than pinned"
        entry.num_pins -= 1

    def drop(self, entry_key: Hashable, reason: str = "dropped") -> None:
        """Forget an entry (superseded, corrupt, ...); its blocks become free."""
        entry = self.entry(entry_key)
        del self._lru[entry.key]
        self.blocks.free(entry.block_ids)
        self._used_bytes -= entry.num_bytes
        self._evictions[reason] += 1

    def _evict_until(self, num_blocks: int) -> None:
        while not self.blocks.can_allocate(num_blocks):
            victim = next((e for e in self._lru.values() if e.num_pins == 0), None)
            if victim is None:
                raise RuntimeError(f"host parking: counted {num_blocks} reclaimable blocks that were not")
            self.drop(victim.key, "lru")

    # ---- parks and restores decided -----------------------------------------------------------------
    def add(
        self, entry_key: Hashable, *, page_ids: Sequence[int], token_ids: Sequence[int],
        checkpoints: Sequence[tuple[int, int]], extras: Sequence[ExtraSpec] = (),
    ) -> HostEntry | None:  # fmt: skip
        """Decide the park of a retained sequence: its pages, the state of each checkpoint, `extras`.

        `checkpoints` are (num_tokens L, state_slot holding the GDN state after token L-1); the longest
        L bounds the identity and the pages copied (`page_ids[:ceil(L / page_size)]`). An entry with
        the same key is replaced. Returns the new entry (its `block_ids` are where the runner copies),
        or None (counting the reason) when the budget cannot hold it; the device state is then simply
        lost and a later request re-prefills.
        """
        cps = sorted(checkpoints)
        if not cps or len({n for n, _ in cps}) != len(cps) or cps[0][0] < 1 or cps[-1][0] > len(token_ids):
            raise ValueError(
                f"park({entry_key!r}): checkpoints {cps} must be distinct, in [1, {len(token_ids)}]"
            )
        num_tokens = cps[-1][0]
        num_pages = self.geometry.pages_for(num_tokens)
        if len(page_ids) < num_pages:
            raise ValueError(f"park({entry_key!r}): {len(page_ids)} pages cannot hold {num_tokens} tokens")
        num_bytes = self.geometry.entry_bytes(num_pages, len(cps), sum(s.num_bytes for s in extras))
        refusal = self._park_refusal(num_bytes, entry_key)
        if refusal is not None:
            self._refusals[refusal] += 1
            return None
        if entry_key in self._lru:
            self.drop(entry_key, "replaced")
        need = self.blocks.blocks_for(num_bytes)
        self._evict_until(need)
        tokens = tuple(token_ids[:num_tokens])
        hashes: list[bytes] = []
        extend_page_hashes(hashes, tokens, num_tokens, self.page_size)
        entry = HostEntry(entry_key, tokens, tuple(n for n, _ in cps), tuple(hashes), num_pages, tuple(extras),
                          num_bytes, self.blocks.allocate(need))  # fmt: skip
        self._lru[entry_key] = entry
        self._used_bytes += num_bytes
        self._counts["parks"] += 1
        self._counts["park_bytes"] += num_bytes
        return entry

    def plan_unpark(
        self, entry_key: Hashable, num_tokens: int | None, num_page_ids: int
    ) -> tuple[HostEntry, int, int]:
        """Check a restore of checkpoint `num_tokens` (default: the longest) into `num_page_ids` pages:
        (the entry, the checkpoint's index, the pages it copies). Moves nothing."""
        entry = self.entry(entry_key)
        num_tokens = entry.checkpoints[-1] if num_tokens is None else num_tokens
        if num_tokens not in entry.checkpoints:
            raise ValueError(
                f"unpark({entry_key!r}): {num_tokens} is not a checkpoint of {entry.checkpoints}"
            )
        num_pages = self.geometry.pages_for(num_tokens)
        if num_page_ids < num_pages:
            raise ValueError(f"unpark({entry_key!r}): {num_page_ids} pages cannot hold {num_tokens} tokens")
        return entry, entry.checkpoints.index(num_tokens), num_pages

    def finish_unpark(self, entry_key: Hashable, *, keep: bool, num_bytes: int, demote: bool = True) -> None:
        """A restore's copies completed (`num_bytes` moved): release one pin, count it; the entry is then
        freed (its bytes are on the device again) unless `keep` or other pins hold it; a kept entry with
        no pins left goes to the front of the LRU (the next to evict) when `demote`, else stays where the
        restore's pin put it."""
        entry = self.entry(entry_key)
        self._counts["restores"] += 1
        self._counts["restore_bytes"] += num_bytes
        if entry.num_pins:
            entry.num_pins -= 1
        if entry.num_pins:  # another scheduled restore still needs it
            self._lru.move_to_end(entry_key)
        elif keep and demote:
            # NOTE: first in line for eviction, not last: the restored checkpoint's tokens are on the device again
            # (parked anew, in a longer entry, if they fall out of it), so what is left here is the entry's later
            # checkpoints, which the request that continued from an earlier one did not want (an agent's next turn
            # continues from the previous prompt end P, not from its generation end G). As the most recently used
            # entry it used to push other sessions' only copies out of a full budget first.
            self._lru.move_to_end(entry_key, last=False)
        elif not keep:  # NOTE: safe while copies run: only later copies on the runner's one copy stream rewrite these blocks
            del self._lru[entry_key]
            self.blocks.free(entry.block_ids)
            self._used_bytes -= entry.num_bytes

    # ---- accounting ------------------------------------------------------------------------------------
    def stats(self) -> HostParkingStats:
        """Current numbers; the copy seconds and the allocated RAM are the runner copier's (0 here)."""
        return HostParkingStats(
            enabled=self.enabled,
            capacity_bytes=self.blocks.capacity_bytes,
            used_bytes=self._used_bytes,
            reserved_bytes=sum(len(e.block_ids) for e in self._lru.values()) * self.blocks.block_bytes,
            allocated_bytes=0,
            num_entries=len(self._lru),
            num_parks=self._counts["parks"],
            num_restores=self._counts["restores"],
            park_bytes=self._counts["park_bytes"],
            restore_bytes=self._counts["restore_bytes"],
            park_seconds=0.0,
            restore_seconds=0.0,
            evictions=dict(self._evictions),
            refusals=dict(self._refusals),
        )

    def check_integrity(self) -> None:
        """Raise RuntimeError (with the numbers) if the entries and the block pool disagree."""
        held: list[int] = []
        used = 0
        for key, entry in self._lru.items():
            want_blocks = self.blocks.blocks_for(entry.num_bytes)
            want_bytes = self.geometry.entry_bytes(
                entry.num_pages, len(entry.checkpoints), sum(s.num_bytes for s in entry.extras)
            )
            if key != entry.key or entry.num_bytes != want_bytes or len(entry.block_ids) != want_blocks:
                raise RuntimeError(
                    f"host entry {entry.key!r} (key {key!r}): {entry.num_bytes} bytes (want {want_bytes}) in "
                    f"{len(entry.block_ids)} blocks (want {want_blocks})"
                )
            cps = entry.checkpoints
            if (not cps or list(cps) != sorted(set(cps)) or cps[0] < 1 or cps[-1] != len(entry.token_ids)
                    or entry.num_pages != self.geometry.pages_for(cps[-1]) or entry.num_pins < 0
                    or len(entry.page_hashes) != len(entry.token_ids) // self.page_size):  # fmt: skip
                raise RuntimeError(
                    f"host entry {entry.key!r}: checkpoints {cps}, {len(entry.token_ids)} tokens, "
                    f"{entry.num_pages} pages, {len(entry.page_hashes)} page hashes, pins {entry.num_pins}"
                )
            held += entry.block_ids
            used += entry.num_bytes
        if used != self._used_bytes:
            raise RuntimeError(f"host entries hold {used} bytes, the counter says {self._used_bytes}")
        if used > self.blocks.capacity_bytes:
            raise RuntimeError(f"host entries hold {used} bytes > capacity {self.blocks.capacity_bytes}")
        self.blocks.check_integrity(held)
