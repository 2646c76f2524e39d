"""Host parking decided by the scheduler (`HostIndex`, pure Python) and executed by the fake runner.

No model and no torch: `scheduler_harness.FakeRunner` copies pages and states to and from its `host`
dict at the blocks' keys, and checks every row's KV against its state, so a wrong restore fails loudly.
"""

from __future__ import annotations

from scheduler_harness import Driver, context_token, make_scheduler, request

from engine.cache.host import HostIndex
from engine.cache.host_blocks import HostBudget
from engine.cache.host_layout import CacheGeometry

PAGE = 4
# One page: 64 bytes, one state snapshot: 32 bytes (the numbers only size the entries).
GEOMETRY = CacheGeometry(page_size=PAGE, paged=(("int64", (PAGE,)),), state=(("int64", (4,)),),
                         page_bytes=(64,), state_bytes=(32,))  # fmt: skip


def host_scheduler(num_blocks: int):
    sched = make_scheduler(lanes=1, num_pages=8, page_size=PAGE, max_context=32)
    index = HostIndex(GEOMETRY, HostBudget(num_blocks * 32, slab_bytes=num_blocks * 32, block_bytes=32))
    sched.attach_host(index)
    return sched, index


def cold_tokens(prompt: list[int], max_tokens: int) -> list[int]:
    drv = Driver(make_scheduler(lanes=1, num_pages=8, page_size=PAGE, max_context=32, prefix_reuse=False))
    drv.add(request("cold", prompt, max_tokens=max_tokens))
    drv.run()
    return drv.tokens["cold"]


def test_a_parked_session_restores_into_new_pages_and_gives_the_cold_tokens() -> None:
    sched, index = host_scheduler(num_blocks=10)  # one 3-page entry (7 blocks) fits
    drv = Driver(sched)
    b = list(range(100, 110))
    drv.add(request("b", b, max_tokens=2))
    drv.run()  # retained: 11 tokens computed, 3 pages
    c = list(range(200, 222))
    drv.add(request("c", c, max_tokens=4, stop_token_ids=[context_token(tuple(c))]))  # its prompt: 6 pages
    drv.run()
    assert len(index) == 1 and drv.runner.host, "b was evicted for c's pages and parked"
    r = b + drv.tokens["b"] + [300, 301, 302]
    drv.add(request("r", r, max_tokens=3))
    drv.run()
    assert drv.reason("r").num_host_cached_tokens == 11 and drv.runner.num_unparks == 1
    assert drv.tokens["r"] == cold_tokens(r, 3)


def test_admission_holds_the_entry_it_restores_while_its_reclaim_parks_others() -> None:
    """r continues the parked b and needs pages that only evicting the retained c frees; parking c would
    need b's host blocks. b is held for r: c's park is refused, b is restored, r equals a cold run."""
    sched, index = host_scheduler(num_blocks=10)  # b (7 blocks) + c (5 blocks) do not both fit
    drv = Driver(sched)
    b = list(range(100, 110))
    drv.add(request("b", b, max_tokens=2))
    drv.run()
    d = list(range(400, 422))
    drv.add(request("d", d, max_tokens=4))
    drv.step()  # d's prompt (6 pages) evicts b: parked
    drv.record(sched.abort("d"))
    c = list(range(200, 208))
    drv.add(request("c", c, max_tokens=4, stop_token_ids=[context_token(tuple(c))]))
    drv.run()  # c retained: 8 tokens, 2 pages
    (key,) = index.entry_keys
    r = b + drv.tokens["b"] + list(range(300, 314))  # 25 known tokens: 7 pages, 6 free
    drv.add(request("r", r, max_tokens=7))
    drv.run()
    assert drv.reason("r").num_host_cached_tokens == 11
    assert index.stats().refusals == {"pinned": 1} and key not in index  # restored, then freed
    assert drv.tokens["r"] == cold_tokens(r, 7)
    sched.check_integrity()


def test_a_session_preempted_and_restored_from_the_host_keeps_its_earlier_checkpoints() -> None:
    """An agent session is preempted while decoding; its message-boundary checkpoint (where its next turn
    continues) and its preemption checkpoint leave the device together as one host entry, and the resume
    restores the longer one. The entry must still hold the boundary: the session's next turn restores it
    (before, restoring an entry's longest checkpoint freed the whole entry, so the next turn started cold)."""
    sched = make_scheduler(lanes=2, num_pages=8, page_size=PAGE, max_context=32)
    index = HostIndex(GEOMETRY, HostBudget(64 * 32, slab_bytes=64 * 32, block_bytes=32))
    sched.attach_host(index)
    drv = Driver(sched)
    drv.add(request("x", list(range(500, 504)), max_tokens=24))  # admitted first: the other lane is preempted
    drv.step()
    a = list(range(100, 110))
    drv.add(request("a", a, max_tokens=16, boundaries=(8,)))
    drv.run()
    assert sched.num_preemptions >= 1 and sched.num_recomputed_tokens == 0
    assert drv.reason("a").num_host_cached_tokens == 0  # usage reports the first admission: cold
    assert index.stats().num_restores >= 1  # the resume restored from the host
    assert drv.tokens["a"] == cold_tokens(a, 16)
    turn = a[:8] + [300, 301, 302, 303]  # the next turn continues from the boundary
    drv.add(request("a2", turn, max_tokens=2))
    drv.run()
    assert drv.reason("a2").num_host_cached_tokens == 8
    assert drv.tokens["a2"] == cold_tokens(turn, 2)


def test_a_device_match_short_of_its_copy_on_write_page_is_restored_from_the_host() -> None:
    """A session's checkpoint ends inside a page, so reusing it needs one new page for the copy-on-write; the
    pool lacks exactly that page while another lane runs. Admission gives the match up and reclaims cold,
    which parks the checkpoint: the request must restore it from the host, not prefill all of it again."""
    sched = make_scheduler(lanes=2, num_pages=8, page_size=PAGE, max_context=32)
    index = HostIndex(GEOMETRY, HostBudget(64 * 32, slab_bytes=64 * 32, block_bytes=32))
    sched.attach_host(index)
    drv = Driver(sched)
    a = list(range(100, 106))
    drv.add(request("a", a, max_tokens=1))
    drv.run()  # retained: 6 tokens on two pages, the second partial
    drv.add(request("x", list(range(500, 517)), max_tokens=12))  # five pages, decoding
    while sched.lanes[0] is None or sched.lanes[0].request.num_computed_tokens < 17:
        drv.step()
    assert sched.pages.num_free == 1  # the match shares one full page and needs two new ones
    turn = a + [300, 301, 302, 303, 304, 305]
    drv.add(request("a2", turn, max_tokens=2))
    drv.run()
    assert drv.reason("a2").num_cached_tokens == 6 == drv.reason("a2").num_host_cached_tokens
    assert drv.tokens["a2"] == cold_tokens(turn, 2)
