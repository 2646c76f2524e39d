"""The scheduler's side of speculative decoding (`--spec mtp`): how many drafts a row carries, what a
prefix hit must copy, and the round counters.

A decode-ready lane holds the drafts the runner proposed in its previous step (`Lane.drafts`, never in
the request's tokens, so never hashed into the prefix index). Its next row feeds the last token and
k <= K drafts at positions m .. m + k and samples all k + 1 of them (a verify row); the runner answers
the accepted drafts plus one token, `num_accepted` = a and `num_rolled_back` = k - a, and commit
counts positions m .. m + a as computed. No page is reserved beyond admission's `prompt + max output
- 1`: k is bounded so that every fed position and every token it can commit fit the request's length
limit (near it, k shrinks to 0: one token per step, counted as a fallback).

Prefix reuse: the MTP pair at position L - 1 of a checkpoint of length L depends on the token after
it, so the new request rewrites the MTP KV at L - 1. That position must be in a page of its own: a
hit ending exactly on a page boundary copies its last full page (copy-on-write) instead of sharing it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from engine.cache.prefix import PrefixMatch
from engine.request import Request, SpecRequestStats
from engine.step import RowPlan


def num_drafts(drafts: tuple[int, ...], request: Request, max_num_tokens: int, budgets: bool) -> int:
    """Drafts a verify row carries. The sequence may grow to `max_num_tokens`, and a row of k drafts can
    commit k + 1 tokens (the last token sits at position num_tokens - 1). With thinking budgets enforced
    (`budgets`), a budget may force the reasoning's close in place of a sampled token, dropping the row's
    later tokens with a state already past them: such a request drafts nothing until out of its reasoning."""
    budget = request.sampling_params.thinking_budget
    if (
        budgets
        and budget is not None
        and budget >= 0
        and (request.in_reasoning or request.num_output_tokens == 0)
    ):
        return 0
    return max(0, min(len(drafts), max_num_tokens - request.num_tokens - 1))


def retains_exactly(row: RowPlan) -> bool:
    """Whether a finish inside this row's tokens still leaves a state that matches the kept tokens: true
    for every row but a verify row (its state was rolled back to the last accepted draft, not to where a
    stop or length limit cut the committed tokens)."""
    return row.num_sample <= 1


def spec_cow_match(match: PrefixMatch, page_size: int) -> PrefixMatch:
    """`match` with the page holding position L - 1 copied rather than shared (see the module docstring)."""
    if match.partial_page_id is not None or not match.shared_page_ids:
        return match
    assert match.num_tokens == len(match.shared_page_ids) * page_size, "a full-page match ends on a boundary"
    return replace(
        match, shared_page_ids=match.shared_page_ids[:-1], partial_page_id=match.shared_page_ids[-1]
    )


@dataclass
class SpecCounters:
    """Speculative rounds since start (plain numbers for /stats and metrics)."""

    num_draft_tokens: int  # K (0: speculation off)
    method: str = "mtp"  # the drafter (--spec), as the per-request statistics name it
    rounds: int = 0  # verify rows (one per lane per step that carried >= 1 draft)
    drafted: int = 0  # drafts fed for verification
    accepted: int = 0  # drafts accepted
    fallbacks: int = 0  # decode rows whose drafts were all dropped (near the length limit)
    accepted_per_position: list[int] = field(default_factory=list)  # [K]: rounds accepting draft j
    # per running request: [rounds, drafted, accepted, fallbacks, accepted at position 0 .. K-1]
    per_request: dict[str, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.accepted_per_position = [0] * self.num_draft_tokens

    def _row(self, request_id: str) -> list[int]:
        return self.per_request.setdefault(request_id, [0] * (4 + self.num_draft_tokens))

    def plan(self, request: Request, available: int, k: int) -> None:
        """A decode row planned with k of `available` drafts."""
        if available and k == 0:
            self.fallbacks += 1
            self._row(request.request_id)[3] += 1

    def verified(self, request: Request, drafted: int, accepted: int) -> None:
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        row = self._row(request.request_id)
        row[0] += 1
        row[1] += drafted
        row[2] += accepted
        for j in range(accepted):
            self.accepted_per_position[j] += 1
            row[4 + j] += 1

    def finish(self, request_id: str) -> SpecRequestStats | None:
        """The ended request's numbers (None without speculation); forgets them."""
        if not self.num_draft_tokens:
            return None
        row = self.per_request.pop(request_id, None) or [0] * (4 + self.num_draft_tokens)
        rounds, drafted, accepted, fallbacks = row[:4]
        return SpecRequestStats(
            self.method, self.num_draft_tokens, rounds, drafted, accepted, fallbacks, tuple(row[4:])
        )
