"""The one-wait greedy round (engine/runner/spec_round.py) against the general round on the same plans: per round
the same committed tokens, accepted and rolled-back counts, the same GDN state in every working slot and the same
MTP continuation state, for drafts accepted in full, in part and not at all, batched, at every K 1..5, on the tiny
dense and MoE models; its drafts stop at a row's page capacity as the general round's do."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from engine_harness import one_thread, tiny_artifact

from engine.core import load_artifact
from engine.request import SamplingParams
from engine.runner import ModelRunner
from engine.spec.mtp import MtpDrafter
from engine.step import RowPlan, StepPlan, StepResult
from engine.testing.bench.spec import make_spec_runner

GREEDY = SamplingParams(temperature=0.0, presence_penalty=0.0)
PAGE = 64  # engine.testing.bench.steps.PAGE_SIZE
PROMPTS = (9, 20, 33)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield


@functools.cache
def _model(arch: str) -> Any:
    return load_artifact(tiny_artifact(arch), device="cpu", dtype=torch.float32, with_mtp=True).model


def _row(
    i: int, tokens: tuple[int, ...], start: int, pages: tuple[int, ...], n_out: int, cold: bool
) -> RowPlan:
    return RowPlan(
        f"r{i}", i, tokens, start, pages, i, cold, None, None, 1 if cold else len(tokens), GREEDY, n_out
    )


class Lanes:
    """Rows decoding through `runner`; `truth` (when given) feeds drafts that agree up to draft `wrong` of each
    round, else the runner's own drafts."""

    def __init__(self, runner: ModelRunner, num_pages: int = 1) -> None:
        self.runner, self.step = runner, 0
        self.pages = [tuple(range(i * num_pages, (i + 1) * num_pages)) for i in range(len(PROMPTS))]
        prompts = [tuple(range(1000 + 37 * i, 1000 + 37 * i + n)) for i, n in enumerate(PROMPTS)]
        result = self.execute([_row(i, p, 0, self.pages[i], 0, True) for i, p in enumerate(prompts)])
        self.out = [list(t) for t in result.sampled_token_ids]
        self.drafts = [list(d) for d in result.draft_token_ids]
        self.pos = list(PROMPTS)

    def execute(self, rows: list[RowPlan]) -> StepResult:
        self.step += 1
        return self.runner.execute(StepPlan(self.step, tuple(rows), (), ()))

    def mixed_drafts(self, want: list[list[int]], k: int, r: int) -> list[list[int]]:
        """Round r's drafts: row i's agree with `want` up to draft (i + r) % (k + 1) (none, some or all
        accepted); the runner's own drafts where `want` runs out."""
        drafts = []
        for i in range(len(PROMPTS)):
            n, bad = len(self.out[i]), (i + r) % (k + 1)
            good = want[i][n : n + k] if n + k <= len(want[i]) else []
            drafts.append(
                [t if j < bad else (t + 1) % 1000 + 3 for j, t in enumerate(good)] or self.drafts[i]
            )
        return drafts

    def round(self, drafts: list[list[int]]) -> StepResult:
        rows = [
            _row(i, (self.out[i][-1], *d), self.pos[i], self.pages[i], len(self.out[i]), False)
            for i, d in enumerate(drafts)
        ]
        result = self.execute(rows)
        for i, tokens in enumerate(result.sampled_token_ids):
            self.out[i] += tokens
            self.pos[i] += len(tokens)
            self.drafts[i] = list(result.draft_token_ids[i])
        return result


def _runner(arch: str, k: int, one_wait: bool, num_pages: int = 1) -> ModelRunner:
    runner = make_spec_runner(_model(arch), len(PROMPTS) * num_pages, len(PROMPTS), "bf16", k, PAGE * num_pages,
                              cuda_graph=False)  # fmt: skip
    assert runner.spec is not None
    runner.spec.one_wait = one_wait
    return runner


def _state(runner: ModelRunner) -> list[torch.Tensor]:
    spec = runner.spec
    assert spec is not None and isinstance(spec.drafter, MtpDrafter)
    slots = list(range(len(PROMPTS)))
    cache = runner.cache
    return [t[:, slots].clone() for t in cache.state_stacks] + [spec.drafter.hidden[slots].clone()]


@pytest.mark.parametrize("arch", ["dense", "moe"])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_the_one_wait_round_commits_and_rolls_back_as_the_general_round(arch: str, k: int) -> None:
    truth = Lanes(_runner(arch, k, one_wait=False, num_pages=2), num_pages=2)
    while min(len(o) for o in truth.out) < 5 * (k + 1) + 1:  # the greedy tokens to draft from
        truth.round(truth.drafts)
    want = truth.out
    lanes = {flag: Lanes(_runner(arch, k, one_wait=flag, num_pages=2), num_pages=2) for flag in (True, False)}
    seen: set[int] = set()
    for r in range(5):
        # row i's drafts agree up to draft (i + r) % (k + 1): none, some or all accepted
        results = {flag: lane.round(lane.mixed_drafts(want, k, r)) for flag, lane in lanes.items()}
        on, off = results[True], results[False]
        seen.update(on.num_accepted)
        assert on.sampled_token_ids == off.sampled_token_ids
        assert on.num_accepted == off.num_accepted and on.num_rolled_back == off.num_rolled_back
        assert [len(d) for d in on.draft_token_ids] == [len(d) for d in off.draft_token_ids]
        for a, b in zip(_state(lanes[True].runner), _state(lanes[False].runner), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert {0, k} <= seen, seen  # drafts rejected at once and accepted in full, at least
    spec = lanes[True].runner.spec
    assert spec is not None and spec.num_one_wait_rounds == 5
    assert lanes[True].out[0][: len(want[0])] == want[0][: len(lanes[True].out[0])]


def test_drafts_stop_at_a_rows_page_capacity_on_both_rounds() -> None:
    """Rows one page long, decoded until they reach its end: the drafts shrink to the slots left, alike."""
    lanes = {flag: Lanes(_runner("dense", 5, one_wait=flag)) for flag in (True, False)}
    while max(lanes[True].pos) < PAGE - 1:
        got = {
            flag: lane.round([d[: PAGE - 1 - p] for d, p in zip(lane.drafts, lane.pos, strict=True)])
            for flag, lane in lanes.items()
        }
        assert got[True].sampled_token_ids == got[False].sampled_token_ids
        assert [len(d) for d in got[True].draft_token_ids] == [len(d) for d in got[False].draft_token_ids]
    assert any(len(d) < 5 for d in lanes[True].drafts), [lane.pos for lane in lanes.values()]
