r"""HostParking: retained sequences parked in host RAM (`--host-kv-cache-mib N`), restored by copy.

Owns: the parked entries (identity, host blocks, LRU order, pins), the copies between device cache
tensors and host blocks, and the statistics. Must not touch: requests, lanes, the device page / slot
ownership (the scheduler frees and allocates those ids; this module only copies bytes at them).

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

Who calls what (engine loop, one thread):
  scheduler  `lookup`, `can_park`, `can_restore` (pure: no bytes move, LRU untouched), then `pin` the
             entry it decides to restore and emit the park / unpark lists in its output;
  runner     `park` each listed sequence (before its freed pages are reused), then `unpark` each
             restore, then makes the compute stream `wait_copies()` before the forward.
On CUDA the copies run on one dedicated stream that first waits for the compute stream; one stream
keeps them FIFO, so host blocks freed by an eviction or a restore are rewritten only after every
earlier copy that read them. Runs of consecutive page ids are copied directly (one copy per run per
tensor per host extent); scattered pages go through a device staging chunk (`CopyPlan`). Slabs are
pinned (page-locked) on CUDA and plain memory on CPU, where the same code copies synchronously.
NOTE: pinning costs ~0.65 s per 512 MiB slab (measured on the H200 host), so the engine should call
`blocks.allocate_slabs()` at startup instead of pinning lazily inside a park.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from engine.cache.host_blocks import DEFAULT_BLOCK_BYTES, DEFAULT_SLAB_BYTES, MIB, HostBlockPool
from engine.cache.host_layout import CacheGeometry, CopyPlan, ExtraSpec, paged_tensors, state_tensors
from engine.cache.prefix import extend_page_hashes

DEFAULT_GATHER_RUN_BYTES = 1 * MIB
DEFAULT_STAGING_BYTES = 64 * MIB

if TYPE_CHECKING:
    from engine.cache.kv import ModelCache


class HostEntryMismatch(ValueError):
    """A parked entry does not fit the cache it is restored into; it has been dropped."""


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
    num_pins: int = 0  # scheduled restores not yet executed: never evicted while > 0


@dataclass(frozen=True, slots=True)
class HostMatch:
    entry_key: Hashable
    num_tokens: int  # the matched checkpoint L
    num_pages: int  # pages a restore of L needs
    num_bytes: int  # bytes a restore of L copies


class ParkHandle:
    """One park or unpark: its size and, on CUDA, the events bracketing its copies on the copy stream."""

    __slots__ = ("kind", "entry_key", "num_bytes", "num_runs", "num_copies", "_start", "_end", "_seconds")

    def __init__(
        self, kind: str, entry_key: Hashable, num_bytes: int, num_runs: int, num_copies: int,
        start: torch.cuda.Event | None, end: torch.cuda.Event | None, seconds: float | None,
    ) -> None:  # fmt: skip
        self.kind = kind  # "park" | "unpark"
        self.entry_key = entry_key
        self.num_bytes = num_bytes
        self.num_runs = num_runs  # coalesced runs of consecutive device page ids
        self.num_copies = num_copies  # copy calls (runs x paged tensors, split at host extent edges, + state)
        self._start, self._end, self._seconds = start, end, seconds

    def done(self) -> bool:
        return self._end is None or self._end.query()

    def synchronize(self) -> None:
        if self._end is not None:
            self._end.synchronize()

    def wait(self, stream: torch.cuda.Stream | None = None) -> None:
        """Make `stream` (default: the current one) wait for these copies, without blocking the host."""
        if self._end is not None:
            (stream or torch.cuda.current_stream(self._end.device)).wait_event(self._end)

    @property
    def seconds(self) -> float | None:
        """Copy time (device time on CUDA), or None while the copies are still running."""
        if self._seconds is None and self._start is not None and self._end is not None and self._end.query():
            self._seconds = self._start.elapsed_time(self._end) / 1000.0
        return self._seconds


@dataclass(frozen=True, slots=True)
class HostParkingStats:
    """Plain numbers for /stats and metrics (the engine never imports monitor)."""

    enabled: bool
    capacity_bytes: int
    used_bytes: int  # payload of the parked entries
    reserved_bytes: int  # blocks they hold (used + the unused tail of each entry's last block)
    allocated_bytes: int  # host RAM really allocated (slabs touched so far)
    num_entries: int
    num_parks: int
    num_restores: int
    park_bytes: int
    restore_bytes: int
    park_seconds: float  # completed copies only
    restore_seconds: float
    evictions: dict[str, int] = field(default_factory=dict)  # reason -> count
    refusals: dict[str, int] = field(default_factory=dict)  # park refused, reason -> count


class HostParking:
    """Entries in a host budget of `capacity_bytes`, whole-entry LRU. `capacity_bytes == 0`: off."""

    def __init__(
        self, geometry: CacheGeometry, capacity_bytes: int, *, slab_bytes: int = DEFAULT_SLAB_BYTES,
        block_bytes: int = DEFAULT_BLOCK_BYTES, device: torch.device | str = "cpu",
        gather_run_bytes: int = DEFAULT_GATHER_RUN_BYTES, staging_bytes: int = DEFAULT_STAGING_BYTES,
    ) -> None:  # fmt: skip
        self.geometry = geometry
        self.gather_run_bytes = gather_run_bytes  # page runs shorter than this on average go through staging
        self.staging_bytes = staging_bytes  # device staging per gather chunk
        self.page_size = geometry.page_size
        self.device = torch.device(device)
        is_cuda = self.device.type == "cuda"
        self.blocks = HostBlockPool(capacity_bytes, slab_bytes, block_bytes, pin_memory=is_cuda)
        self._stream = torch.cuda.Stream(self.device) if is_cuda else None
        self._last_event: torch.cuda.Event | None = None
        self._lru: OrderedDict[Hashable, HostEntry] = OrderedDict()  # oldest first
        self._used_bytes = 0
        self._pending: list[ParkHandle] = []  # CUDA handles whose seconds are not yet counted
        self._counts: Counter[str] = Counter()  # parks, restores, park_bytes, restore_bytes
        self._seconds = {"park": 0.0, "unpark": 0.0}
        self._evictions: Counter[str] = Counter()
        self._refusals: Counter[str] = Counter()

    @classmethod
    def from_mib(
        cls, geometry: CacheGeometry, host_kv_cache_mib: int, *, slab_bytes: int = DEFAULT_SLAB_BYTES,
        block_bytes: int = DEFAULT_BLOCK_BYTES, device: torch.device | str = "cpu",
    ) -> HostParking:  # fmt: skip
        """The `--host-kv-cache-mib N` budget (0 = off)."""
        if host_kv_cache_mib < 0:
            raise ValueError(f"host_kv_cache_mib={host_kv_cache_mib!r}: must be >= 0 (0 = off)")
        return cls(
            geometry, host_kv_cache_mib * MIB, slab_bytes=slab_bytes, block_bytes=block_bytes, device=device
        )

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

    def pin(self, entry_key: Hashable) -> None:
        self.entry(entry_key).num_pins += 1
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

    # ---- copies ----------------------------------------------------------------------------------------
    def park(
        self, entry_key: Hashable, cache: ModelCache, *, page_ids: Sequence[int], token_ids: Sequence[int],
        checkpoints: Sequence[tuple[int, int]], extra: Mapping[str, torch.Tensor] | None = None,
    ) -> ParkHandle | None:  # fmt: skip
        """Copy a retained sequence to host: its pages, the state of each checkpoint, `extra`.

        `checkpoints` are (num_tokens L, state_slot holding the GDN state after token L-1); the longest
        L bounds the identity and the pages copied (`page_ids[:ceil(L / page_size)]`). An entry with
        the same key is replaced. Returns None (and counts the reason) when the budget cannot hold it;
        the device state is then simply lost and a later request re-prefills.
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
        self._check_geometry(cache, f"park({entry_key!r})")
        extras = tuple(ExtraSpec.of(name, t) for name, t in sorted((extra or {}).items()))
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
        entry = HostEntry(entry_key, tokens, tuple(n for n, _ in cps), tuple(hashes), num_pages, extras,
                          num_bytes, self.blocks.allocate(need))  # fmt: skip
        self._lru[entry_key] = entry
        self._used_bytes += num_bytes
        plan = self._plan(entry.block_ids, to_host=True)
        num_runs = plan.add_pages(self.geometry, paged_tensors(cache), num_pages, page_ids[:num_pages])
        state, logical = state_tensors(cache), num_pages * self.geometry.bytes_per_page
        for i, (_, slot) in enumerate(cps):
            plan.add_state(self.geometry, state, logical + i * self.geometry.bytes_per_checkpoint, slot)
        plan.add_extras(extras, logical + len(cps) * self.geometry.bytes_per_checkpoint, extra or {})
        assert plan.num_bytes == num_bytes, f"park copies {plan.num_bytes} bytes of a {num_bytes}-byte entry"
        return self._execute(plan, "park", entry_key, num_runs)

    def unpark(
        self, entry_key: Hashable, cache: ModelCache, *, page_ids: Sequence[int], state_slot: int,
        num_tokens: int | None = None, extra: Mapping[str, torch.Tensor] | None = None, keep: bool = False,
    ) -> ParkHandle:  # fmt: skip
        """Copy checkpoint `num_tokens` (default: the longest) back into `page_ids` and `state_slot`.

        Only the ceil(L / page_size) pages of that checkpoint are copied (into page_ids[:that]), plus
        its state and, when `extra` destinations are given, the parked extras. Releases one pin. The
        entry is then freed (its bytes are on the device again) unless `keep` or other pins hold it; a kept
        entry with no pins left goes to the front of the LRU (the next to evict).
        A geometry mismatch drops the entry and raises `HostEntryMismatch` (the request prefills cold).
        """
        entry = self.entry(entry_key)
        try:
            self._check_geometry(cache, f"unpark({entry_key!r})")
        except ValueError as exc:
            self.drop(entry_key, "mismatch")
            raise HostEntryMismatch(str(exc)) from None
        num_tokens = entry.checkpoints[-1] if num_tokens is None else num_tokens
        if num_tokens not in entry.checkpoints:
            raise ValueError(
                f"unpark({entry_key!r}): {num_tokens} is not a checkpoint of {entry.checkpoints}"
            )
        num_pages = self.geometry.pages_for(num_tokens)
        if len(page_ids) < num_pages:
            raise ValueError(f"unpark({entry_key!r}): {len(page_ids)} pages cannot hold {num_tokens} tokens")
        if extra is not None and set(extra) != {s.name for s in entry.extras}:
            raise ValueError(
                f"unpark({entry_key!r}): extras {sorted(extra)} != parked {[s.name for s in entry.extras]}"
            )
        plan = self._plan(entry.block_ids, to_host=False)
        num_runs = plan.add_pages(self.geometry, paged_tensors(cache), entry.num_pages, page_ids[:num_pages])
        logical = entry.num_pages * self.geometry.bytes_per_page
        cp_index = entry.checkpoints.index(num_tokens)
        plan.add_state(self.geometry, state_tensors(cache), logical + cp_index * self.geometry.bytes_per_checkpoint,
                       state_slot)  # fmt: skip
        if extra is not None:
            plan.add_extras(
                entry.extras, logical + len(entry.checkpoints) * self.geometry.bytes_per_checkpoint, extra
            )
        handle = self._execute(plan, "unpark", entry_key, num_runs)
        if entry.num_pins:
            entry.num_pins -= 1
        if entry.num_pins:  # another scheduled restore still needs it
            self._lru.move_to_end(entry_key)
        elif keep:
            # NOTE: first in line for eviction, not last: the restored checkpoint's tokens are on the device again
            # (parked anew, in a longer entry, if they fall out of it), so what is left here is the entry's later
            # checkpoints, which the request that continued from an earlier one did not want (an agent's next turn
            # continues from the previous prompt end P, not from its generation end G). As the most recently used
            # entry it used to push other sessions' only copies out of a full budget first.
            self._lru.move_to_end(entry_key, last=False)
        else:  # NOTE: safe while the copies run: only later copies on the same stream rewrite these blocks
            del self._lru[entry_key]
            self.blocks.free(entry.block_ids)
            self._used_bytes -= entry.num_bytes
        return handle

    def _plan(self, block_ids: list[int], to_host: bool) -> CopyPlan:
        return CopyPlan(self.blocks, block_ids, to_host, self.gather_run_bytes, self.staging_bytes)

    def _check_geometry(self, cache: ModelCache, what: str) -> None:
        geometry = CacheGeometry.of(cache)
        if geometry != self.geometry:
            raise ValueError(f"{what}: cache geometry {geometry} != parking geometry {self.geometry}")

    def _execute(self, plan: CopyPlan, kind: str, entry_key: Hashable, num_runs: int) -> ParkHandle:
        counts_key = "parks" if kind == "park" else "restores"
        self._counts[counts_key] += 1
        self._counts[f"{kind}_bytes"] += plan.num_bytes
        if self._stream is None:
            start = time.perf_counter()
            plan.execute(non_blocking=False)
            seconds = time.perf_counter() - start
            self._seconds[kind] += seconds
            return ParkHandle(kind, entry_key, plan.num_bytes, num_runs, plan.num_copies, None, None, seconds)
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self._stream):
            begin.record()
            plan.execute(non_blocking=True)
            end.record()
        self._last_event = end
        handle = ParkHandle(kind, entry_key, plan.num_bytes, num_runs, plan.num_copies, begin, end, None)
        self._pending.append(handle)
        return handle

    def wait_copies(self, stream: torch.cuda.Stream | None = None) -> None:
        """Make `stream` (default: current) wait for every copy issued so far (no host block)."""
        if self._last_event is not None:
            (stream or torch.cuda.current_stream(self.device)).wait_event(self._last_event)

    def synchronize(self) -> None:
        """Block the host until every copy issued so far is complete."""
        if self._last_event is not None:
            self._last_event.synchronize()
        self.poll()

    def poll(self) -> None:
        """Count the seconds of CUDA copies that have completed (call once per engine step)."""
        still: list[ParkHandle] = []
        for handle in self._pending:
            seconds = handle.seconds
            if seconds is None:
                still.append(handle)
            else:
                self._seconds[handle.kind] += seconds
        self._pending = still

    # ---- accounting ------------------------------------------------------------------------------------
    def stats(self) -> HostParkingStats:
        """Current numbers (engine thread: it also counts the seconds of completed CUDA copies)."""
        self.poll()
        return HostParkingStats(
            enabled=self.enabled,
            capacity_bytes=self.blocks.capacity_bytes,
            used_bytes=self._used_bytes,
            reserved_bytes=sum(len(e.block_ids) for e in self._lru.values()) * self.blocks.block_bytes,
            allocated_bytes=self.blocks.allocated_bytes,
            num_entries=len(self._lru),
            num_parks=self._counts["parks"],
            num_restores=self._counts["restores"],
            park_bytes=self._counts["park_bytes"],
            restore_bytes=self._counts["unpark_bytes"],
            park_seconds=self._seconds["park"],
            restore_seconds=self._seconds["unpark"],
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
