"""PrefixIndex on its own: token-exact checkpoint matching, page references, pins, LRU and reclaim."""

from __future__ import annotations

import pytest

from engine.cache.pages import PagePool
from engine.cache.prefix import PrefixIndex, extend_page_hashes
from engine.cache.state import StateSlotPool


def _index(max_checkpoints: int = 4, num_pages: int = 8, num_slots: int = 6) -> PrefixIndex:
    return PrefixIndex(PagePool(num_pages=num_pages, page_size=4), StateSlotPool(num_slots), max_checkpoints)


def _retain(index: PrefixIndex, tokens: list[int], num_tokens: int | None = None) -> list[int]:
    """Allocate pages and a slot as a finished request would, retain, then drop the request's refs."""
    num_tokens = len(tokens) if num_tokens is None else num_tokens
    pages = index.pages.allocate(index.pages.pages_for(len(tokens)))
    slot = index.slots.allocate()
    assert slot is not None
    index.insert(tokens, [], num_tokens, pages, slot)
    index.pages.free(pages)
    return pages


def _lookup(index: PrefixIndex, tokens: list[int], max_tokens: int | None = None):
    max_tokens = len(tokens) if max_tokens is None else max_tokens
    hashes: list[bytes] = []
    extend_page_hashes(hashes, tokens, max_tokens, index.page_size)
    return index.lookup(tokens, hashes, max_tokens)


def test_page_hashes_are_chained_and_extend_incrementally() -> None:
    tokens = list(range(13))
    whole: list[bytes] = []
    extend_page_hashes(whole, tokens, 13, 4)
    part: list[bytes] = []
    extend_page_hashes(part, tokens, 5, 4)
    extend_page_hashes(part, tokens, 13, 4)
    assert len(whole) == 3 and part == whole
    other: list[bytes] = []
    extend_page_hashes(other, [99] + tokens[1:], 13, 4)
    assert all(a != b for a, b in zip(whole, other, strict=True))  # page 0 differs: every later hash does


def test_lookup_returns_the_longest_token_exact_checkpoint() -> None:
    index = _index()
    pages = _retain(index, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], num_tokens=10)
    match = _lookup(index, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])
    assert match is not None and match.num_tokens == 10
    assert match.shared_page_ids == tuple(pages[:2]) and match.partial_page_id == pages[2]
    assert _lookup(index, [1, 2, 3, 4, 5, 6, 7, 8, 9, 99, 11]) is None  # the tail differs
    assert _lookup(index, [1, 2, 3, 0, 5, 6, 7, 8, 9, 10, 11]) is None  # a full page differs
    assert _lookup(index, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], max_tokens=9) is None  # too long for max
    index.check_integrity()


def test_a_later_branch_falls_back_to_the_earlier_checkpoint_of_the_conversation() -> None:
    index = _index()
    conversation = list(range(1, 15))
    _retain(index, conversation, num_tokens=6)  # an earlier message boundary
    _retain(index, conversation, num_tokens=14)  # the end of the retained sequence
    match = _lookup(index, conversation[:9] + [77, 78])
    assert match is not None and match.num_tokens == 6
    match = _lookup(index, conversation + [1])
    assert match is not None and match.num_tokens == 14


def test_checkpoints_hold_page_references_until_evicted() -> None:
    index = _index()
    pages = _retain(index, list(range(1, 10)))
    assert [index.pages.ref_count(p) for p in pages] == [1, 1, 1] and index.pages.num_free == 5
    assert index.evict_lru()
    assert index.pages.num_free == 8 and index.slots.num_free == 6 and len(index) == 0
    assert not index.evict_lru()


def test_identical_insert_refreshes_instead_of_duplicating() -> None:
    index = _index()
    _retain(index, [5, 6, 7, 8, 9])
    _retain(index, [5, 6, 7, 8, 9])
    assert len(index) == 1 and index.slots.num_free == 5 and index.pages.num_free == 6
    index.check_integrity()


def test_budget_evicts_least_recently_used_and_never_a_pinned_checkpoint() -> None:
    index = _index(max_checkpoints=2)
    _retain(index, [1] * 5)
    _retain(index, [2] * 5)
    first = _lookup(index, [1] * 6)  # touches [1]*5: now [2]*5 is the LRU
    assert first is not None
    index.pin(first.checkpoint)
    _retain(index, [3] * 5)
    assert sorted(cp.tail_token_ids for cp in index.checkpoints) == [(1,), (3,)]
    index.pin(index.checkpoints[-1])
    _retain(index, [4] * 5)  # both others pinned: the budget is exceeded until a pin is released
    assert len(index) == 3
    index.unpin(first.checkpoint)
    assert index.evict_lru()
    assert sorted(cp.tail_token_ids for cp in index.checkpoints) == [(3,), (4,)]


def test_zero_budget_retains_nothing() -> None:
    index = _index(max_checkpoints=0)
    _retain(index, [1, 2, 3])
    assert len(index) == 0 and index.pages.num_free == 8 and index.slots.num_free == 6


def test_reclaim_evicts_only_when_enough_pages_can_come_free() -> None:
    index = _index(max_checkpoints=4, num_pages=8)
    _retain(index, [1] * 8)  # 2 pages
    _retain(index, [2] * 8)  # 2 pages
    held = index.pages.allocate(3)  # a running request
    assert index.pages.num_free == 1 and index.num_reclaimable_pages() == 4
    assert not index.reclaim_pages(6)
    assert len(index) == 2, "a reclaim that cannot succeed must not evict"
    assert index.reclaim_pages(3)
    assert len(index) == 1 and index.pages.num_free == 3  # only the LRU checkpoint went
    index.pages.free(held)
    index.check_integrity()


def test_shared_pages_are_not_counted_reclaimable_while_a_request_holds_them() -> None:
    index = _index()
    pages = _retain(index, [1] * 8)
    index.pages.incref(pages[:1])  # a running request shares the first page
    assert index.num_reclaimable_pages() == 1


def test_allocate_slot_evicts_a_checkpoint_when_all_slots_are_held() -> None:
    index = _index(num_slots=2)
    _retain(index, [1] * 4)
    _retain(index, [2] * 4)
    slot = index.allocate_slot()
    assert slot is not None and len(index) == 1
    index.pin(index.checkpoints[0])
    assert index.allocate_slot() is None


def test_check_integrity_reports_a_checkpoint_on_a_free_page() -> None:
    index = _index()
    pages = _retain(index, [1] * 6)
    index.pages.free(pages)  # a bug: somebody dropped the checkpoint's references
    with pytest.raises(RuntimeError, match="holds free page"):
        index.check_integrity()


def test_num_pages_held_counts_the_distinct_pages_of_the_checkpoints() -> None:
    """With no request running, the pool's pages in use are exactly the checkpoints' (/stats num_pages_cached)."""
    index = _index(max_checkpoints=2)
    pages = index.pages.allocate(3)
    slots = [index.slots.allocate() for _ in range(2)]
    tokens = list(range(12))
    index.insert(tokens, [], 6, pages, slots[0])  # pages 0..1
    index.insert(tokens, [], 12, pages, slots[1])  # pages 0..2: shares two
    assert index.pages.num_reclaimable == 0  # the request still holds all three
    index.pages.free(pages)
    assert index.num_pages_held == 3 == index.pages.num_in_use == index.pages.num_reclaimable
    index.pages.incref(pages[:1])  # a request sharing the first page: eviction could not free it
    assert index.pages.num_reclaimable == 2
    index.check_integrity()
    index.pages.free(pages[:1])
    _retain(index, [50, 51, 52, 53, 54])  # a third checkpoint evicts the LRU one (6 tokens): no page freed
    assert index.num_pages_held == 5 == index.pages.num_in_use
    index.check_integrity()
    index.clear()
    assert index.num_pages_held == 0 == index.pages.num_in_use
