"""PagePool: allocation, reference counts, the LRU-ordered free queue and check_integrity()."""

from __future__ import annotations

import pytest

from engine.cache.pages import PagePool


def test_allocate_free_and_counts() -> None:
    pool = PagePool(num_pages=8, page_size=4)
    assert (pool.num_free, pool.num_in_use) == (8, 0)
    a = pool.allocate(3)
    assert len(set(a)) == 3 and all(pool.ref_count(p) == 1 for p in a)
    assert (pool.num_free, pool.num_in_use) == (5, 3)
    assert pool.can_allocate(5) and not pool.can_allocate(6)
    pool.free(a)
    assert pool.num_free == 8
    pool.check_integrity()


def test_allocate_more_than_free_raises_with_the_numbers() -> None:
    pool = PagePool(num_pages=8, page_size=4)
    pool.allocate(6)
    with pytest.raises(RuntimeError, match=r"allocate\(3\): only 2 of 8 pages free"):
        pool.allocate(3)
    pool.check_integrity()


def test_shared_pages_stay_in_use_until_the_last_holder_frees_them() -> None:
    pool = PagePool(num_pages=8, page_size=4)
    pages = pool.allocate(2)
    pool.incref(pages)
    pool.free(pages)
    assert pool.num_free == 6 and [pool.ref_count(p) for p in pages] == [1, 1]
    pool.free(pages)
    assert pool.num_free == 8
    with pytest.raises(RuntimeError, match="has ref_count 0"):
        pool.free(pages[:1])
    pool.check_integrity()


def test_free_queue_order_is_lru_and_a_sequence_frees_its_tail_first() -> None:
    pool = PagePool(num_pages=8, page_size=4)
    first = pool.allocate(8)
    assert first == list(range(8))  # a fresh pool hands out pages in id order
    pool.free([0, 1, 2])  # one sequence: freed in reverse, so its tail page 2 is reused first
    pool.free([5])
    assert pool.allocate(4) == [2, 1, 0, 5]
    pool.check_integrity()


def test_incref_revives_a_free_page_from_the_middle_of_the_queue() -> None:
    pool = PagePool(num_pages=8, page_size=4)
    pool.allocate(8)
    pool.free([3])
    pool.free([4])
    pool.free([6])
    pool.incref([4])  # O(1) removal from the middle
    assert pool.ref_count(4) == 1 and pool.num_free == 2
    pool.check_integrity()
    assert pool.allocate(2) == [3, 6]


def test_pages_for_rounds_up() -> None:
    pool = PagePool(num_pages=8, page_size=4)
    assert [pool.pages_for(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_check_integrity_reports_the_disagreeing_numbers() -> None:
    pool = PagePool(num_pages=8, page_size=4)
    pages = pool.allocate(2)
    pool.pages[pages[0]].ref_count = 0  # in use but not queued
    with pytest.raises(
        RuntimeError, match=r"7 pages have ref_count 0 but 6 are queued free \(unqueued: \[0\]"
    ):
        pool.check_integrity()
    pool.pages[pages[0]].ref_count = -1
    with pytest.raises(RuntimeError, match="negative ref counts"):
        pool.check_integrity()


def test_check_integrity_detects_a_broken_free_count() -> None:
    pool = PagePool(num_pages=8, page_size=4)
    pool.free_queue.num_free = 7
    with pytest.raises(RuntimeError, match="free queue walks 8 pages but counts 7"):
        pool.check_integrity()


@pytest.mark.parametrize(("num_pages", "page_size", "field"), [(0, 4, "num_pages"), (8, 0, "page_size")])
def test_bad_sizes_are_refused(num_pages: int, page_size: int, field: str) -> None:
    with pytest.raises(ValueError, match=f"{field}=0"):
        PagePool(num_pages=num_pages, page_size=page_size)
