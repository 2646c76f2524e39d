"""The thinking budget's seam in the scheduler: `commit` counts reasoning tokens and, once the budget is spent
inside the reasoning, appends the template's `\\n</think>\\n\\n` in place of the sampled token; the runner then
feeds those tokens like any others (the fake runner checks KV and state agree for every row)."""

from __future__ import annotations

from collections.abc import Callable

from scheduler_harness import Driver, FakeRunner, context_token, make_scheduler, request

from engine.request import FinishKind, ReasoningTokens

START, END = 5, 6
MARKERS = ReasoningTokens(start_id=START, end_id=END, close_ids=(7, END, 8))
OPENS = [1, 2, START]  # a prompt whose generation starts inside the reasoning


def _run(
    prompt: list[int],
    max_tokens: int,
    token_fn: Callable[[tuple[int, ...]], int] = context_token,
    **sampling: object,
) -> tuple[list[int], FinishKind]:
    sched = make_scheduler(num_pages=16, max_context=64, reasoning_tokens=MARKERS)
    drv = Driver(sched, FakeRunner(sched, token_fn))
    assert drv.add(request("r", prompt, max_tokens=max_tokens, **sampling)) is None
    drv.run()
    return drv.tokens["r"], drv.reason("r").reason.kind


def test_a_spent_budget_closes_the_reasoning_and_generation_goes_on_after_it() -> None:
    tokens, kind = _run(OPENS, max_tokens=10, thinking_budget=3)
    assert all(t >= 10 for t in tokens[:3])  # three reasoning tokens as sampled
    assert tokens[3:6] == [7, END, 8]  # then the forced close, in place of the 4th sampled token
    assert all(t >= 10 for t in tokens[6:]) and len(tokens) == 10
    assert kind is FinishKind.LENGTH


def test_budget_zero_closes_at_once_and_the_close_is_cut_to_the_length_limit() -> None:
    assert _run(OPENS, max_tokens=5, thinking_budget=0)[0][:3] == [7, END, 8]
    tokens, kind = _run(OPENS, max_tokens=4, thinking_budget=2)
    assert tokens[2:] == [7, END] and kind is FinishKind.LENGTH


def test_no_budget_or_a_closed_reasoning_is_left_alone() -> None:
    for budget in (None, -1):
        tokens, _ = _run(OPENS, max_tokens=8, thinking_budget=budget)
        assert all(t >= 10 for t in tokens)
    tokens, _ = _run([1, START, 9, END, 2], max_tokens=8, thinking_budget=1)  # the prompt closed it
    assert all(t >= 10 for t in tokens)


def test_a_reasoning_the_model_ends_itself_is_not_cut_later() -> None:
    def ends_early(context: tuple[int, ...]) -> int:
        return END if len(context) == len(OPENS) + 2 else context_token(context)

    tokens, _ = _run(OPENS, max_tokens=10, token_fn=ends_early, thinking_budget=3)
    assert tokens[2] == END and 7 not in tokens


def test_an_output_that_opens_its_own_reasoning_is_budgeted() -> None:
    def opens(context: tuple[int, ...]) -> int:
        return START if len(context) == 2 else context_token(context)

    tokens, _ = _run([1, 2], max_tokens=8, token_fn=opens, thinking_budget=2)
    assert tokens[0] == START and tokens[3:6] == [7, END, 8]
