"""Hybrid prefix reuse through the scheduler: checkpoints, copy-on-write, state restores, LRU.

Driven by `scheduler_harness.FakeRunner` (the step contract on plain lists): its sampled token is a
fixed function of the whole context and it checks KV against state on every row, so "a reused request
gives the cold request's tokens" is asserted exactly.
"""

from __future__ import annotations

from scheduler_harness import Driver, make_scheduler, request


def _cold_tokens(prompt: list[int], max_tokens: int) -> list[int]:
    drv = Driver(make_scheduler(num_pages=32, max_context=64, prefix_reuse=False))
    drv.add(request("cold", prompt, max_tokens))
    drv.run()
    return drv.tokens["cold"]


def _turn(
    drv: Driver, rid: str, prompt: list[int], max_tokens: int = 4, boundaries: tuple[int, ...] = ()
) -> int:
    """Run one request to completion alone; return its number of reused tokens."""
    drv.add(request(rid, prompt, max_tokens, boundaries=boundaries))
    drv.run()
    assert drv.tokens[rid] == _cold_tokens(prompt, max_tokens), f"{rid}: reused tokens differ from cold"
    return drv.reason(rid).num_cached_tokens


def test_appended_turn_reuses_the_retained_sequence_with_copy_on_write() -> None:
    drv = Driver(make_scheduler(num_pages=32, max_context=64))
    p1 = [1, 2, 3, 4, 5, 6]
    assert _turn(drv, "t1", p1) == 0
    # Retained: prompt + 3 fed output tokens (the 4th was sampled, never fed) = 9 tokens.
    assert [cp.num_tokens for cp in drv.scheduler.prefix.checkpoints] == [9]
    p2 = p1 + drv.tokens["t1"] + [7, 8, 9]
    assert _turn(drv, "t2", p2) == 9
    assert drv.runner.num_restores == 1
    assert drv.runner.num_page_copies == 1  # 9 % 4 = 1: the partial page was copied, not shared
    assert drv.scheduler.stats().num_prefix_hits == 1


def test_page_aligned_checkpoint_shares_every_page_without_a_copy() -> None:
    drv = Driver(make_scheduler(num_pages=32, max_context=64))
    p1 = [1, 2, 3, 4, 5]
    _turn(drv, "t1", p1, max_tokens=4)  # retained length 5 + 3 = 8 = two full pages
    assert _turn(drv, "t2", p1 + drv.tokens["t1"] + [9]) == 8
    assert drv.runner.num_page_copies == 0 and drv.runner.num_restores == 1


def test_rewind_branches_from_an_earlier_message_boundary_checkpoint() -> None:
    drv = Driver(make_scheduler(num_pages=32, max_context=64, prefill_chunk=16))
    p1 = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert _turn(drv, "t1", p1, boundaries=(3, 7, 10)) == 0
    assert sorted(cp.num_tokens for cp in drv.scheduler.prefix.checkpoints) == [3, 7, 10, 13]
    # The agent rewinds: keeps the first 7 tokens, then says something else.
    p_rewind = p1[:7] + [42, 43, 44]
    assert _turn(drv, "rewind", p_rewind) == 7
    # And the newest retained sequence is still reusable by an appending turn.
    p_append = p1 + drv.tokens["t1"][:3] + [50]
    assert _turn(drv, "append", p_append) == 13


def test_prefill_chunks_are_cut_at_boundaries_and_snapshots_saved_there() -> None:
    drv = Driver(make_scheduler(num_pages=32, max_context=64, prefill_chunk=8, max_boundary_saves=2))
    drv.add(request("r", list(range(1, 15)), max_tokens=2, boundaries=(2, 5, 11)))
    rows = []
    while drv.scheduler.has_work():
        rows.extend(drv.step().rows)
    # Only the last two boundaries are saved (max_boundary_saves=2); chunks end exactly there.
    assert [(r.start_pos, r.end_pos, r.save_state_to is not None) for r in rows[:3]] == [
        (0, 5, True),
        (5, 11, True),
        (11, 14, False),
    ]
    assert sorted(cp.num_tokens for cp in drv.scheduler.prefix.checkpoints) == [5, 11, 15]


def test_full_prompt_match_still_computes_the_last_prompt_token() -> None:
    drv = Driver(make_scheduler(num_pages=32, max_context=64))
    p1 = [1, 2, 3, 4, 5, 6]
    _turn(drv, "t1", p1, boundaries=(4, 6))
    # Same prompt again (a regenerate): the checkpoint at 6 cannot give logits, the one at 4 is used.
    assert _turn(drv, "again", p1) == 4


def test_two_lanes_reuse_one_checkpoint_in_the_same_step() -> None:
    drv = Driver(make_scheduler(lanes=2, num_pages=32, max_context=64))
    p1 = [1, 2, 3, 4, 5]
    _turn(drv, "t1", p1, max_tokens=2)  # retains 6 tokens
    base = p1 + drv.tokens["t1"][:1]
    drv.add(request("x", [*base, 20, 21], 3))
    drv.add(request("y", [*base, 30], 3))
    out = drv.step()
    assert [(r.copy_state_from is not None, r.start_pos) for r in out.rows] == [(True, 6), (True, 6)]
    assert len(out.page_copies) == 2 and len({dst for _, dst in out.page_copies}) == 2
    drv.run()
    assert drv.tokens["x"] == _cold_tokens([*base, 20, 21], 3)
    assert drv.tokens["y"] == _cold_tokens([*base, 30], 3)


def test_a_request_reuses_a_boundary_saved_by_a_request_still_running() -> None:
    drv = Driver(make_scheduler(lanes=2, num_pages=32, max_context=64, prefill_chunk=16))
    drv.add(request("a", [1, 2, 3, 4, 5, 6], max_tokens=10, boundaries=(5,)))
    drv.step()  # a's prefill stops at 5 and saves
    drv.step()
    drv.add(request("b", [1, 2, 3, 4, 5, 9, 9], max_tokens=3))
    drv.run()
    assert drv.reason("b").num_cached_tokens == 5
    assert drv.tokens["a"] == _cold_tokens([1, 2, 3, 4, 5, 6], 10)
    assert drv.tokens["b"] == _cold_tokens([1, 2, 3, 4, 5, 9, 9], 3)


def test_checkpoint_budget_evicts_the_least_recently_used() -> None:
    drv = Driver(make_scheduler(num_pages=32, max_context=64, max_checkpoints=2))
    prompts = {name: [seed] * 5 for name, seed in (("a", 1), ("b", 2), ("c", 3))}
    for name in "ab":
        _turn(drv, name, prompts[name], max_tokens=2)
    # Touch "a" so that "b" becomes the least recently used, then retain "c".
    assert _turn(drv, "a2", prompts["a"] + drv.tokens["a"][:1] + [7], max_tokens=1) == 6
    _turn(drv, "c", prompts["c"], max_tokens=2)
    assert len(drv.scheduler.prefix) == 2
    assert _turn(drv, "b2", prompts["b"] + drv.tokens["b"][:1] + [7], max_tokens=1) == 0


def test_retained_pages_are_reclaimed_when_admission_needs_them() -> None:
    drv = Driver(make_scheduler(num_pages=8, max_context=32, max_checkpoints=4))
    for i in range(3):
        _turn(drv, f"r{i}", [10 + i] * 6, max_tokens=3)  # each retains 8 tokens = 2 pages
    assert drv.scheduler.pages.num_free == 2
    _turn(drv, "big", [99] * 20, max_tokens=9)  # 28 positions = 7 pages: must evict 3 checkpoints
    assert drv.scheduler.prefix.num_evictions == 3


def test_no_prefix_reuse_retains_nothing() -> None:
    sched = make_scheduler(num_pages=16, max_context=32, prefix_reuse=False)
    drv = Driver(sched)
    drv.add(request("a", [1, 2, 3, 4, 5], 3, boundaries=(3,)))
    drv.run()
    drv.add(request("b", [1, 2, 3, 4, 5] + drv.tokens["a"], 2))
    drv.run()
    assert sched.prefix is None and drv.reason("b").num_cached_tokens == 0
    assert sched.pages.num_free == sched.pages.num_pages and sched.slots.num_free == sched.slots.num_slots
