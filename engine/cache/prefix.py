r"""PrefixIndex: prefix reuse for a hybrid (Gated DeltaNet + attention) model, at state checkpoints.

Owns: the checkpoints (retained sequences and message boundaries), their LRU order and budget, and
the page / state-slot references they hold. Must not touch: requests, lanes, tensors.

Why checkpoints and not any page boundary: attention KV can be cut at any page, but GDN conv and
recurrent state summarise *all* earlier tokens and cannot be rebuilt from KV. A prefix is reusable
only where its state was saved. So a `Checkpoint` is atomic: the token prefix `[0, num_tokens)`, the
KV pages covering it, and the state slot holding the GDN state right after token `num_tokens - 1`.
Evicting a checkpoint drops both (KV without state, or state without KV, is useless).

    tokens     t0 .................................. t(L-1) | later tokens of the source sequence
    pages      [  page a  |  page b  |  page c  |  page d ...... ]
               \________ full, shared read-only _/ \_ partial: copy-on-write __/
    state      ----------------------------------------------> snapshot at L (state_slot)

A request that reuses a checkpoint of length L shares the full pages (incref) and must write its own
tokens from position L on. When L is not a page multiple, the last page is partial and still holds
the source sequence's later tokens: the request gets a fresh page and the runner copies the source
page into it before the step (copy-on-write). Recomputing the partial page instead is impossible
here: it would need the GDN state at the page boundary, which was never saved.

Matching is token-exact through a chained hash: page i's hash is blake2b(hash(i-1) + tokens of
page i) (16 bytes, cryptographic, so a hash match is treated as a token match), plus a direct
comparison of the < page_size tail tokens. A lookup returns the longest checkpoint that is a prefix
of the new tokens, which also covers branching: an agent that rewinds to an earlier turn matches that
turn's boundary checkpoint even though the newest retained sequence diverges after it.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from hashlib import blake2b

from engine.cache.pages import PagePool
from engine.cache.state import StateSlotPool


def extend_page_hashes(
    hashes: list[bytes], token_ids: Sequence[int], num_tokens: int, page_size: int
) -> None:
    """Append the chained hashes of the full pages of `token_ids[:num_tokens]` not yet in `hashes`.

    `hashes` must have been built from a prefix of the same `token_ids` (tokens only ever append).
    """
    parent = hashes[-1] if hashes else b""
    for i in range(len(hashes), num_tokens // page_size):
        page_tokens = array("q", token_ids[i * page_size : (i + 1) * page_size]).tobytes()
        parent = blake2b(parent + page_tokens, digest_size=16).digest()
        hashes.append(parent)


@dataclass(slots=True, eq=False)
class Checkpoint:
    checkpoint_id: int
    num_tokens: int  # L: the state is the one after token L-1
    prefix_hash: bytes  # chained hash of the L // page_size full pages (b"" if none)
    tail_token_ids: tuple[int, ...]  # tokens [L // page_size * page_size, L)
    page_ids: tuple[int, ...]  # pages covering [0, L): ceil(L / page_size), one reference each
    state_slot: int
    num_pins: int = 0  # admitted requests whose restore from this checkpoint has not run yet
    token_ids: tuple[int, ...] | None = None  # [0, L), kept only with `keep_token_ids` (host parking)


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    checkpoint: Checkpoint
    num_tokens: int  # reused tokens (= checkpoint.num_tokens)
    shared_page_ids: tuple[int, ...]  # full pages, shared read-only (the caller increfs them)
    partial_page_id: int | None  # page to copy-on-write into the request's own page, if L % page_size


class PrefixIndex:
    """At most `max_checkpoints` checkpoints, LRU-ordered (lookup hits and inserts refresh them).

    Pinned checkpoints (a restore from them is scheduled but not yet executed) are never evicted.
    `on_evict(cp, keep)` (host parking) is called with each LRU victim while it still holds its pages
    and state slot, and returns further unpinned checkpoints (never `keep`) to evict with it, e.g. the
    later checkpoints of the same sequence, parked together; `keep_token_ids` stores each checkpoint's
    tokens for that caller.
    """

    def __init__(
        self, pages: PagePool, slots: StateSlotPool, max_checkpoints: int, *, keep_token_ids: bool = False
    ) -> None:
        self.pages = pages
        self.slots = slots
        self.page_size = pages.page_size
        self.max_checkpoints = max_checkpoints
        self.keep_token_ids = keep_token_ids
        self.on_evict: Callable[[Checkpoint, Checkpoint | None], Sequence[Checkpoint]] | None = None
        self._lru: OrderedDict[int, Checkpoint] = OrderedDict()  # oldest first
        self._next_id = 0
        self.num_evictions = 0

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def num_pages_held(self) -> int:
        """Distinct pages the checkpoints hold (also counted in the pool's pages in use). With no request
        running, every page in use is one of them: a page in use beyond them is a leak."""
        return self.pages.num_retained

    @property
    def checkpoints(self) -> list[Checkpoint]:
        return list(self._lru.values())

    def lookup(
        self, token_ids: Sequence[int], page_hashes: list[bytes], max_tokens: int
    ) -> PrefixMatch | None:
        """The longest checkpoint with L <= max_tokens whose tokens equal `token_ids[:L]`.

        `page_hashes` must cover the full pages of `token_ids[:max_tokens]` (`extend_page_hashes`).
        """
        assert len(page_hashes) >= max_tokens // self.page_size, "page_hashes do not cover max_tokens"
        best: Checkpoint | None = None
        for cp in self._lru.values():  # oldest first, so ties go to the most recently used
            if cp.num_tokens > max_tokens or (best is not None and cp.num_tokens < best.num_tokens):
                continue
            num_full = cp.num_tokens // self.page_size
            if num_full and page_hashes[num_full - 1] != cp.prefix_hash:
                continue
            if tuple(token_ids[num_full * self.page_size : cp.num_tokens]) != cp.tail_token_ids:
                continue
            best = cp
        if best is None:
            return None
        self._lru.move_to_end(best.checkpoint_id)
        num_full = best.num_tokens // self.page_size
        partial = best.page_ids[num_full] if best.num_tokens % self.page_size else None
        return PrefixMatch(best, best.num_tokens, best.page_ids[:num_full], partial)

    def insert(
        self,
        token_ids: Sequence[int],
        page_hashes: list[bytes],
        num_tokens: int,
        page_ids: Sequence[int],
        state_slot: int,
    ) -> Checkpoint | None:
        """Retain `token_ids[:num_tokens]` with the state in `state_slot` (ownership moves here).

        Adds one reference to each page covering the prefix; the caller keeps its own references.
        An identical checkpoint is refreshed instead (the new slot is freed). Returns None if the
        budget is zero.
        """
        num_pages = self.pages.pages_for(num_tokens)
        assert 1 <= num_tokens <= len(token_ids) and len(page_ids) >= num_pages, "checkpoint out of range"
        extend_page_hashes(page_hashes, token_ids, num_tokens, self.page_size)
        num_full = num_tokens // self.page_size
        prefix_hash = page_hashes[num_full - 1] if num_full else b""
        tail = tuple(token_ids[num_full * self.page_size : num_tokens])
        for cp in self._lru.values():
            if cp.num_tokens == num_tokens and cp.prefix_hash == prefix_hash and cp.tail_token_ids == tail:
                self.slots.free(state_slot)
                self._lru.move_to_end(cp.checkpoint_id)
                return cp
        if self.max_checkpoints == 0:
            self.slots.free(state_slot)
            return None
        cp = Checkpoint(self._next_id, num_tokens, prefix_hash, tail, tuple(page_ids[:num_pages]), state_slot)
        if self.keep_token_ids:
            cp.token_ids = tuple(token_ids[:num_tokens])
        self._next_id += 1
        self.pages.incref(cp.page_ids, retained=True)
        self._lru[cp.checkpoint_id] = cp
        while len(self._lru) > self.max_checkpoints and self.evict_lru(keep=cp):
            pass
        return cp

    def pin(self, cp: Checkpoint) -> None:
        cp.num_pins += 1

    def unpin(self, cp: Checkpoint) -> None:
        assert cp.num_pins > 0, f"checkpoint {cp.checkpoint_id} unpinned more than pinned"
        cp.num_pins -= 1

    def evict_lru(self, keep: Checkpoint | None = None) -> bool:
        """Drop the least recently used unpinned checkpoint (not `keep`); False if there is none."""
        for cp in self._lru.values():
            if cp.num_pins == 0 and cp is not keep:
                self._drop(cp, keep)
                return True
        return False

    def _drop(self, cp: Checkpoint, keep: Checkpoint | None = None) -> None:
        extra = self.on_evict(cp, keep) if self.on_evict is not None else ()
        for victim in (cp, *extra):
            assert victim.num_pins == 0 and victim is not keep, f"evicting checkpoint {victim.checkpoint_id}"
            del self._lru[victim.checkpoint_id]
            self.pages.free(victim.page_ids, retained=True)
            self.slots.free(victim.state_slot)
            self.num_evictions += 1

    def clear(self) -> None:
        """Drop every unpinned checkpoint."""
        while self.evict_lru():
            pass

    def allocate_slot(self) -> int | None:
        """A free state slot, evicting the LRU unpinned checkpoint if needed; None if impossible."""
        slot = self.slots.allocate()
        while slot is None and self.evict_lru():
            slot = self.slots.allocate()
        return slot

    def num_reclaimable_pages(self) -> int:
        """Pages that would become free if every unpinned checkpoint were evicted."""
        holders: dict[int, int] = {}
        for cp in self._lru.values():
            if cp.num_pins == 0:
                for page_id in cp.page_ids:
                    holders[page_id] = holders.get(page_id, 0) + 1
        return sum(1 for page_id, n in holders.items() if self.pages.ref_count(page_id) == n)

    def reclaim_pages(self, num_pages: int) -> bool:
        """Evict LRU checkpoints until `num_pages` pages are free. Evicts nothing if that cannot work."""
        if self.pages.can_allocate(num_pages):
            return True
        if self.pages.num_free + self.num_reclaimable_pages() < num_pages:
            return False
        while not self.pages.can_allocate(num_pages):
            if not self.evict_lru():
                raise RuntimeError(f"reclaim_pages({num_pages}): counted reclaimable pages that were not")
        return True

    def check_integrity(self) -> None:
        slots = [cp.state_slot for cp in self._lru.values()]
        if len(set(slots)) != len(slots):
            raise RuntimeError(f"checkpoints share state slots: {slots}")
        holders: dict[int, int] = {}
        for cp in self._lru.values():
            for page_id in cp.page_ids:
                holders[page_id] = holders.get(page_id, 0) + 1
        counted = {p.page_id: p.retained for p in self.pages.pages if p.retained}
        if holders != counted:
            raise RuntimeError(f"checkpoints hold {len(holders)} pages, the pool's counts say {len(counted)}")
        for cp in self._lru.values():
            want = self.pages.pages_for(cp.num_tokens)
            if len(cp.page_ids) != want:
                raise RuntimeError(
                    f"checkpoint {cp.checkpoint_id}: {len(cp.page_ids)} pages for {cp.num_tokens} tokens, want {want}"
                )
            if len(cp.tail_token_ids) != cp.num_tokens % self.page_size or cp.num_pins < 0:
                raise RuntimeError(
                    f"checkpoint {cp.checkpoint_id}: tail {len(cp.tail_token_ids)} tokens for L={cp.num_tokens}, "
                    f"pins {cp.num_pins}"
                )
            for page_id in cp.page_ids:
                if self.pages.ref_count(page_id) < 1:
                    raise RuntimeError(f"checkpoint {cp.checkpoint_id} holds free page {page_id}")
