"""Thinking budgets at commit: which tokens a sampled token becomes (itself, or the reasoning's forced close).

Owns: the per-request reasoning bookkeeping (`Request.in_reasoning`, `num_reasoning_tokens`), mutated only
from the scheduler's commit (engine/scheduler/scheduler.py's module docstring says the rule).
"""

from __future__ import annotations

from engine.request import ReasoningTokens, Request


def reasoning_step(markers: ReasoningTokens | None, request: Request, token: int) -> tuple[int, ...]:
    """The tokens to append for sampled `token`: itself, or the reasoning's forced close once the request's
    thinking budget is spent. Tracks whether the request is inside its reasoning."""
    if markers is None:
        return (token,)
    if not request.in_reasoning:
        request.in_reasoning = token == markers.start_id and request.num_output_tokens == 0
        return (token,)
    budget = request.sampling_params.thinking_budget
    if token == markers.end_id:
        request.in_reasoning = False
    elif budget is not None and budget >= 0 and request.num_reasoning_tokens >= budget:
        request.in_reasoning = False
        return markers.close_ids
    else:
        request.num_reasoning_tokens += 1
    return (token,)
