"""PagePool: page ids, reference counts and the free list of the one device KV pool.

Owns: which of the `num_pages` pages are free and how many holders each used page has. Holders are
running requests (their page-table rows) and prefix checkpoints (retained sequences). Must not touch:
tensors (the KV cache owner indexes its `[.., num_pages, page_size, ..]` tensors by these ids), requests.

KV pages carry no content hash here (unlike vLLM): in a hybrid model KV alone cannot be resumed
without the matching GDN state, so content identity lives in `engine.cache.prefix.Checkpoint`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(slots=True, eq=False)
class Page:
    page_id: int
    ref_count: int = 0
    retained: int = 0  # of ref_count, the holders that are prefix checkpoints
    prev_free: Page | None = None
    next_free: Page | None = None


class FreePageQueue:
    """Intrusive doubly linked list of free pages, with head and tail sentinels (vLLM's shape).

    O(1) `popleft`, `append` and `remove` from the middle. Its order *is* the eviction order: the head
    is the page freed longest ago, so recently freed pages are handed out last.

        head <-> p7 <-> p2 <-> p5 <-> tail
                 ^ popleft()          ^ append()
    """

    def __init__(self, pages: Iterable[Page]) -> None:
        self._head = Page(-1)
        self._tail = Page(-2)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free = 0
        for page in pages:
            self.append(page)

    def popleft(self) -> Page:
        page = self._head.next_free
        assert page is not None and page is not self._tail, "popleft() on an empty free queue"
        self.remove(page)
        return page

    def append(self, page: Page) -> None:
        assert page.prev_free is None and page.next_free is None, f"page {page.page_id} already queued"
        last = self._tail.prev_free
        assert last is not None
        last.next_free = page
        page.prev_free = last
        page.next_free = self._tail
        self._tail.prev_free = page
        self.num_free += 1

    def remove(self, page: Page) -> None:
        prev, nxt = page.prev_free, page.next_free
        assert prev is not None and nxt is not None, f"page {page.page_id} is not in the free queue"
        prev.next_free = nxt
        nxt.prev_free = prev
        page.prev_free = page.next_free = None
        self.num_free -= 1

    def __iter__(self) -> Iterator[Page]:
        page = self._head.next_free
        while page is not None and page is not self._tail:
            yield page
            page = page.next_free

    def walk_backwards(self) -> list[Page]:
        out = []
        page = self._tail.prev_free
        while page is not None and page is not self._head:
            out.append(page)
            page = page.prev_free
        return out


class PagePool:
    """A fixed pool of `num_pages` KV pages of `page_size` token slots each.

    Page `p` holds the token slots `p * page_size .. p * page_size + page_size - 1` of the KV tensors
    (`slot = page_id * page_size + offset`). A request's page-table row maps its logical page i
    (positions `i * page_size ..`) to a page id:

        positions   0 ....... P-1 | P ...... 2P-1 | 2P ... 2P+5 ......... 3P-1
        page_table  [      7      |       2      |        5 (partial)          ]
        ref_count         2              2                1
                    (shared with a checkpoint)     (owned: only this request writes it)

    Only pages with ref_count 0 are in the free queue; `allocate` takes from its head, `free`
    decrements and returns pages reaching 0 to its tail. Nothing is ever resized after startup.
    """

    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages < 1:
            raise ValueError(f"num_pages={num_pages!r}: must be >= 1")
        if page_size < 1:
            raise ValueError(f"page_size={page_size!r}: must be >= 1")
        self.num_pages = num_pages
        self.page_size = page_size
        self.pages = [Page(i) for i in range(num_pages)]
        self.free_queue = FreePageQueue(self.pages)
        self.num_retained = 0  # pages at least one prefix checkpoint holds
        self.num_reclaimable = (
            0  # pages only checkpoints hold (ref_count == retained): evicting them frees these
        )

    @property
    def num_free(self) -> int:
        return self.free_queue.num_free

    @property
    def num_in_use(self) -> int:
        return self.num_pages - self.free_queue.num_free

    def pages_for(self, num_tokens: int) -> int:
        """Pages needed to hold `num_tokens` token slots."""
        return -(-num_tokens // self.page_size)

    def can_allocate(self, num_pages: int) -> bool:
        return num_pages <= self.free_queue.num_free

    def allocate(self, num_pages: int) -> list[int]:
        """Take `num_pages` free pages (ref_count 1 each), least recently freed first."""
        if not self.can_allocate(num_pages):
            raise RuntimeError(f"allocate({num_pages}): only {self.num_free} of {self.num_pages} pages free")
        out = []
        for _ in range(num_pages):
            page = self.free_queue.popleft()
            assert page.ref_count == 0, f"free page {page.page_id} has ref_count {page.ref_count}"
            page.ref_count = 1
            out.append(page.page_id)
        return out

    def incref(self, page_ids: Iterable[int], *, retained: bool = False) -> None:
        """Add a holder to each page (`retained`: a prefix checkpoint). A free page is taken back out of the free
        queue (revived)."""
        for page_id in page_ids:
            page = self.pages[page_id]
            before = _reclaimable(page)
            if page.ref_count == 0:
                self.free_queue.remove(page)
            page.ref_count += 1
            if retained:
                self.num_retained += page.retained == 0
                page.retained += 1
            self.num_reclaimable += _reclaimable(page) - before

    def free(self, page_ids: Iterable[int], *, retained: bool = False) -> None:
        """Drop one holder from each page (`retained`: a prefix checkpoint), in reverse, so a sequence's tail pages
        are reused first."""
        for page_id in reversed(list(page_ids)):
            page = self.pages[page_id]
            if page.ref_count <= 0 or (retained and page.retained <= 0):
                raise RuntimeError(
                    f"free(): page {page_id} has ref_count {page.ref_count}, {page.retained} retained"
                )
            before = _reclaimable(page)
            page.ref_count -= 1
            if retained:
                page.retained -= 1
                self.num_retained -= page.retained == 0
            self.num_reclaimable += _reclaimable(page) - before
            if page.ref_count == 0:
                self.free_queue.append(page)

    def ref_count(self, page_id: int) -> int:
        return self.pages[page_id].ref_count

    def check_integrity(self) -> None:
        """Raise RuntimeError, with the numbers that disagree, if the accounting is inconsistent."""
        queued = list(self.free_queue)
        if len(queued) != self.free_queue.num_free:
            raise RuntimeError(f"free queue walks {len(queued)} pages but counts {self.free_queue.num_free}")
        if [p.page_id for p in reversed(self.free_queue.walk_backwards())] != [p.page_id for p in queued]:
            raise RuntimeError("free queue prev/next links disagree")
        queued_ids = {p.page_id for p in queued}
        if len(queued_ids) != len(queued):
            raise RuntimeError(f"free queue holds duplicates: {len(queued)} entries, {len(queued_ids)} pages")
        zero = {p.page_id for p in self.pages if p.ref_count == 0}
        if zero != queued_ids:
            raise RuntimeError(
                f"{len(zero)} pages have ref_count 0 but {len(queued_ids)} are queued free "
                f"(unqueued: {sorted(zero - queued_ids)[:8]}, queued in use: {sorted(queued_ids - zero)[:8]})"
            )
        negative = [(p.page_id, p.ref_count) for p in self.pages if p.ref_count < 0]
        if negative:
            raise RuntimeError(f"negative ref counts (page, count): {negative[:8]}")
        retained = sum(1 for p in self.pages if p.retained > 0)
        reclaimable = sum(_reclaimable(p) for p in self.pages)
        if (retained, reclaimable) != (self.num_retained, self.num_reclaimable):
            raise RuntimeError(
                f"{retained} pages retained and {reclaimable} reclaimable, the counts say {self.num_retained} "
                f"and {self.num_reclaimable}"
            )
        in_use = sum(1 for p in self.pages if p.ref_count > 0)
        if self.num_free + in_use != self.num_pages:
            raise RuntimeError(
                f"num_free {self.num_free} + pages in use {in_use} != num_pages {self.num_pages}"
            )


def _reclaimable(page: Page) -> int:
    """1 when only prefix checkpoints hold `page` (evicting them would free it), else 0."""
    return int(page.retained > 0 and page.ref_count == page.retained)
