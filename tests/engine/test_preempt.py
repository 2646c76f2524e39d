"""KV pages on demand: lanes grow page by page, a short pool preempts the newest lane, and a preempted
request resumes with exactly the tokens of an unconstrained run.

Two levels: the scheduler with `scheduler_harness.FakeRunner` (which checks every row's KV against
its state, so a resume from a wrong state fails loudly), and the real engine on the tiny dense and MoE
models (greedy: identical tokens, the GDN state rebuilt by recompute or by a host restore).
"""

from __future__ import annotations

import random

import pytest
from engine_harness import GREEDY, alone, make_core, one_thread, prompt, run
from scheduler_harness import Driver, context_token, make_scheduler, request

from engine.request import FinishKind


def _cold(prompt_ids: list[int], max_tokens: int) -> list[int]:
    context, out = list(prompt_ids), []
    while len(out) < max_tokens:
        out.append(context_token(tuple(context)))
        context.append(out[-1])
    return out


def test_a_lane_reserves_its_prompt_and_grows_page_by_page() -> None:
    sched = make_scheduler(lanes=1, num_pages=8, page_size=4, max_context=32)
    drv = Driver(sched)
    drv.add(request("a", [1] * 5, max_tokens=12))  # 16 positions are fed at most: 4 pages
    drv.step()  # prefill of 5 tokens: 2 pages
    lane = sched.lanes[0]
    assert lane is not None and len(lane.page_ids) == 2
    sizes = []
    while sched.has_work():
        lane = sched.lanes[0]
        drv.step()
        if lane is not None:
            sizes.append(len(lane.page_ids))
    assert sizes[-1] == 4 and sizes == sorted(sizes), sizes
    assert drv.tokens["a"] == _cold([1] * 5, 12)


def test_the_newest_lane_is_preempted_and_resumes_with_the_same_tokens() -> None:
    sched = make_scheduler(lanes=3, num_pages=8, page_size=4, max_context=32, prefix_reuse=False)
    drv = Driver(sched)
    prompts = {"a": [1, 2, 3, 4, 5], "b": [2, 3, 4, 5, 6], "c": [3, 4, 5, 6, 7]}
    for rid, p in prompts.items():
        drv.add(request(rid, p, max_tokens=10))  # 14 positions fed: 4 pages each, 12 for all three
    drv.run()
    assert sched.num_preemptions >= 1
    for rid, p in prompts.items():
        assert drv.tokens[rid] == _cold(p, 10), rid
        assert drv.reason(rid).reason.kind is FinishKind.LENGTH
    assert sched.pages.num_free == sched.pages.num_pages


@pytest.mark.parametrize("mode", ["recompute", "prefix", "host"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_traffic_on_a_short_pool_matches_cold_tokens(mode: str, seed: int) -> None:
    rng = random.Random(seed)
    sched = make_scheduler(lanes=4, num_pages=10, page_size=4, max_context=40, prefill_chunk=rng.choice([3, 8]),
                           prefix_reuse=mode != "recompute", max_checkpoints=4, max_pending=32)  # fmt: skip
    if mode == "host":
        from test_scheduler_host import GEOMETRY

        from engine.cache.host import HostIndex
        from engine.cache.host_blocks import HostBudget

        sched.attach_host(HostIndex(GEOMETRY, HostBudget(40 * 32, slab_bytes=40 * 32, block_bytes=32)))
    drv = Driver(sched)
    wanted: dict[str, list[int]] = {}
    for i in range(24):
        p = [rng.randrange(1, 9) for _ in range(rng.randrange(1, 14))]
        if rng.random() < 0.5:  # shared prefixes: prefix hits (copy-on-write, restores) get preempted too
            p = [7, 1, 7, 2, 7, 3][: rng.randrange(1, 7)] + p[:8]
        max_tokens = rng.randrange(1, 40 - len(p))
        rid = f"r{i}"
        assert drv.add(request(rid, p, max_tokens=max_tokens)) is None
        wanted[rid] = _cold(p, max_tokens)
        for _ in range(rng.randrange(0, 4)):
            drv.step()
    drv.run()
    assert sched.num_preemptions > 0, "the pool was never short: the test does not test preemption"
    for rid, tokens in wanted.items():
        assert drv.tokens[rid] == tokens, rid
        assert drv.reason(rid).num_cached_tokens <= drv.reason(rid).num_prompt_tokens
    if sched.prefix is not None:
        sched.prefix.clear()
    assert sched.pages.num_free == sched.pages.num_pages


@pytest.mark.parametrize("arch", ["dense", "moe"])
def test_engine_preempts_on_a_short_pool_and_matches_an_unconstrained_run(arch: str) -> None:
    """Three lanes of 12 + 24 tokens on a pool of one max_context (40 tokens): lanes are preempted
    (recomputed, or restored from the host) and each output equals the request run alone."""
    prompts = [prompt(12, seed) for seed in range(3)]
    params = GREEDY.__class__(temperature=0.0, max_tokens=24, ignore_eos=True)
    with one_thread():
        expected = alone(arch, prompts, params, page_size=8, max_context=40)
        for flags in ({"prefix_reuse": False}, {"host_kv_cache_mib": 1}):
            core = make_core(arch, page_size=8, max_context=40, kv_capacity=40, max_concurrency=3, **flags)
            tokens, finish = run(core, prompts, params)
            assert core.scheduler.num_preemptions > 0, flags
            assert tokens == expected, flags
            assert all(f.reason.kind is FinishKind.LENGTH for f in finish.values())
