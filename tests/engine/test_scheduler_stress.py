"""Randomised (seeded, deterministic) scheduler runs: arrivals, aborts, shared prefixes, rewinds.

Driven by `scheduler_harness.FakeRunner` (the real runner does not exist yet). After every step the
page/slot accounting is checked; at the end every request has exactly one terminal event, every
finished request produced exactly the tokens of a cold run, and with the checkpoints dropped every
page and slot is free again.
"""

from __future__ import annotations

import random

import pytest
from scheduler_harness import Driver, context_token, make_scheduler, request

from engine.request import FinishKind


def _cold(prompt: list[int], max_tokens: int, max_context: int) -> list[int]:
    context, out = list(prompt), []
    while len(out) < max_tokens and len(context) < max_context:
        tok = context_token(tuple(context))
        out.append(tok)
        context.append(tok)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("lanes", [1, 3, 8])
def test_random_traffic_keeps_accounting_and_matches_cold_tokens(seed: int, lanes: int) -> None:
    rng = random.Random(seed)
    max_context = 48
    chunk = rng.choice([3, 8, 16])
    decoding = (None, 1, 2, 5)[seed]  # by seed, not drawn: the traffic stays what it was
    sched = make_scheduler(
        lanes=lanes,
        num_pages=40,
        page_size=4,
        max_context=max_context,
        prefill_chunk=chunk,
        prefill_chunk_decoding=None if decoding is None else min(decoding, chunk),
        max_pending=12,
        max_checkpoints=rng.choice([3, 4, 8]),
    )
    drv = Driver(sched)
    conversations: list[list[int]] = [
        [rng.randrange(1, 9) for _ in range(rng.randrange(2, 12))] for _ in range(4)
    ]
    prompts: dict[str, tuple[list[int], int]] = {}
    for i in range(60):
        if rng.random() < 0.6:
            base = rng.choice(conversations)
            cut = rng.randrange(1, len(base) + 1)  # append (cut = len) or rewind (shorter)
            prompt = base[:cut] + [rng.randrange(1, 9) for _ in range(rng.randrange(1, 6))]
            prompt = prompt[: max_context - 2]
        else:
            prompt = [rng.randrange(1, 9) for _ in range(rng.randrange(1, 20))]
        marks = tuple(sorted(rng.sample(range(1, len(prompt) + 1), k=min(2, len(prompt)))))
        max_tokens = rng.randrange(1, 10)
        rid = f"r{i}"
        prompts[rid] = (prompt, max_tokens)
        drv.add(request(rid, prompt, max_tokens, boundaries=marks))
        for _ in range(rng.randrange(0, 4)):
            if sched.has_work():
                drv.step()
        if rng.random() < 0.15 and sched.requests:
            drv.record(sched.abort(rng.choice(sorted(sched.requests))))
            sched.check_integrity()
        if rng.random() < 0.3 and rid in drv.tokens:
            conversations[rng.randrange(len(conversations))] = prompt + drv.tokens[rid]
    drv.run()
    assert sorted(drv.finishes) == sorted(prompts)
    num_finished = 0
    for rid, (prompt, max_tokens) in prompts.items():
        event = drv.reason(rid)
        if event.reason.kind in (FinishKind.LENGTH, FinishKind.CONTEXT):
            assert drv.tokens[rid] == _cold(prompt, max_tokens, max_context), rid
            num_finished += 1
        else:
            assert event.reason.kind in (FinishKind.ABORTED, FinishKind.REJECTED), event
    assert num_finished >= 15 and sched.stats().num_prefix_hits > 0  # the reuse paths were exercised
    sched.prefix.clear()
    sched.check_integrity()
    assert sched.pages.num_free == sched.pages.num_pages and sched.slots.num_free == sched.slots.num_slots
