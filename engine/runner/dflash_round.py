"""The DFlash rounds with one host wait (`--spec dflash`). Greedy: the verify (with the target features of the
companion's layers) on the static target buffers, acceptance and rollback on the device (engine/runner/spec_round.py
`verdict_on_device`), then the drafter's round on its own static buffers (engine/spec/dflash_graphs.py: store the fed
positions' context KV, the block at each row's device frontier e = s + accepted + 1 anchored at the bonus), the
head's argmax, and one copy of every row's (accepted count, bonus token, K drafts) to the host. Sampled (temperature,
top-k/p, min-p, penalties; `NINFER_SPEC_ONE_WAIT_SAMPLED`): the same with the verdict of rejection sampling on the
device and the drafts drawn from the head's processed q, which stays on the device for the next verify
(engine/runner/spec_sampled.py `sampled_verdict` / `finish_sampled`, the MTP sampled round's own). `static_proposals`:
the general round's drafter on the same buffers, when its rows are verify rows of one width.

The greedy round takes the rows the MTP one-wait round takes (all greedy verify rows of one width, no penalties,
grammar or logprobs), the sampled one those of the MTP sampled round, when both the verify and the drafter's buffers
hold them. Against the general round (engine/runner/speculative.py, its eager `DFlashDrafter.advance`): the same
committed tokens (greedy: the target's argmax at the accepted positions; sampled: the same rule and distributions),
the same context KV at every position before the frontier (the general round stores the kept positions only; this
one all fed positions, those past the frontier rewritten before any block reads them), the same drafts (the same
block over the same context, padded to a bucket with the padding masked; the same processed q). Owns nothing: it
runs on the `SpecExecutor`'s model, cache, drafter and graphs. Must not touch: requests, the scheduler.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from engine.request import SamplingParams
from engine.runner.spec_round import Outcome, commit, greedy_plain, one_wait_width, verdict_on_device
from engine.runner.spec_sampled import drafts_have_q, finish_sampled, host_free, sampled_verdict
from engine.spec.dflash_draft import DFlashDrafter
from engine.spec.dflash_graphs import DraftRow
from engine.spec.graphs import StaticRow
from engine.spec.mtp import DraftRow as MtpDraftRow
from engine.spec.mtp import Proposal
from engine.spec.verify import draft_on_device
from engine.step import RowPlan
from engine.transfer import upload

if TYPE_CHECKING:
    from engine.runner.speculative import SpecExecutor


def dflash_one_wait_rows(
    ex: SpecExecutor, rows: Sequence[RowPlan], plain: Callable[[SamplingParams], bool] = greedy_plain
) -> list[StaticRow] | None:
    """The verify's static rows of the one-wait DFlash round over `rows`, or None when they do not take it (`plain`:
    the params every row must pass, as in `one_wait_width`; default the greedy round's)."""
    if ex.graphs is None or ex.draft_graphs is None or not isinstance(ex.drafter, DFlashDrafter):
        return None
    width = one_wait_width(ex, rows, plain)
    if width is None:
        return None
    verify = ex.static_rows(rows, width)
    if not ex.graphs.fits(verify, width) or not ex.draft_graphs.fits(_draft_rows(rows), width):
        return None
    return verify


def dflash_sampled_rows(ex: SpecExecutor, rows: Sequence[RowPlan]) -> list[StaticRow] | None:
    """The verify's static rows of the sampled one-wait DFlash round over `rows` (sampled or penalized rows, nothing
    host-side, every sampled row's drafts with their q: engine/runner/spec_sampled.py), or None."""
    verify = dflash_one_wait_rows(ex, rows, host_free)
    return verify if verify is not None and drafts_have_q(ex, rows) else None


def _draft_rows(rows: Sequence[RowPlan]) -> list[DraftRow]:
    return [DraftRow(row.start_pos, row.page_ids) for row in rows]


def run_dflash_one_wait(
    ex: SpecExecutor, rows: Sequence[RowPlan], verify: list[StaticRow], history: dict[str, list[int]]
) -> Outcome:
    """One round over `rows` (`verify`: their `dflash_one_wait_rows`); `history` gets each row's committed tokens."""
    graphs, draft_graphs = ex.graphs, ex.draft_graphs
    assert graphs is not None and draft_graphs is not None
    width = rows[0].num_tokens
    hidden, features = graphs.target_features(verify, width)  # [n * width, H], [n * width, F]
    ex.num_verify_forwards += 1
    accepted, bonus, _, starts, _ = verdict_on_device(ex, rows, hidden, width)
    hidden = draft_graphs.draft(_draft_rows(rows), features, starts + accepted + 1, bonus, width)  # [n, K, H]
    drafts = (
        ex.model.compute_logits(hidden.reshape(len(rows) * ex.k, -1)).argmax(dim=-1).view(len(rows), ex.k)
    )
    verdict = torch.cat([accepted[:, None], bonus[:, None], drafts], dim=1).tolist()  # the one wait
    # the eager drafter proposes K for every drafting row (a block writes no KV: no page-capacity limit)
    return commit(ex, rows, verdict, history, [ex.k] * len(rows))


def run_dflash_sampled(
    ex: SpecExecutor, rows: Sequence[RowPlan], verify: list[StaticRow], history: dict[str, list[int]]
) -> Outcome:
    """One sampled round over `rows` (`verify`: their `dflash_sampled_rows`): the verify with features, the verdict
    and rollback on the device (`sampled_verdict`), the drafter's round at each row's device frontier, K drafts a
    row drawn from the head's processed q (every position's penalty counts: the output after this round's commits,
    as `DFlashDrafter.proposals` counts them), then the one copy (`finish_sampled`); `history` gets each row's
    committed tokens, the executor each sampled row's new drafts' q."""
    graphs, draft_graphs = ex.graphs, ex.draft_graphs
    assert graphs is not None and draft_graphs is not None
    n, width, k = len(rows), rows[0].num_tokens, ex.k
    hidden, features = graphs.target_features(verify, width)  # [n * width, H], [n * width, F]
    ex.num_verify_forwards += 1
    v = sampled_verdict(ex, rows, hidden, history)
    block = draft_graphs.draft(
        _draft_rows(rows), features, v.starts + v.accepted + 1, v.bonus, width
    )  # [n, K, H]
    logits = ex.model.compute_logits(block.reshape(n * k, -1))
    counts = v.counts.repeat_interleave(k, dim=0) if v.counts is not None else None
    params = [p for p in v.params for _ in range(k)]
    drafts, q = draft_on_device(logits, params, [g for g in v.gens for _ in range(k)], counts)
    q_rows = q.view(n, k, -1) if q is not None else None
    # the eager drafter proposes K for every drafting row (a block writes no KV: no page-capacity limit)
    return finish_sampled(ex, rows, v, drafts.view(n, k), q_rows, history, lambda _: [k] * n)


def static_proposals(
    ex: SpecExecutor, rows: Sequence[RowPlan], draft_rows: Sequence[MtpDraftRow], features: torch.Tensor
) -> list[Proposal] | None:
    """The general round's proposals through the drafter's static buffers (its verdict already on the host: e and
    the anchor uploaded), or None when the rows are not verify rows of one width that fit them (a prefill chunk, a
    row that samples nothing): the caller runs `DFlashDrafter.advance`. `features`: the verify's, in plan order."""
    draft_graphs, drafter = ex.draft_graphs, ex.drafter
    if draft_graphs is None or not isinstance(drafter, DFlashDrafter) or not rows:
        return None
    width = rows[0].num_tokens
    if any(r.num_tokens != width or r.num_sample != width for r in rows):
        return None
    static = _draft_rows(rows)
    if any(d.bonus is None for d in draft_rows) or not draft_graphs.fits(static, width):
        return None
    n = len(rows)
    up = upload(
        [*(d.start_pos + len(d.tokens) for d in draft_rows), *(d.bonus or 0 for d in draft_rows)], ex.device
    )
    hidden = draft_graphs.draft(static, features, up[:n], up[n:], width)  # [n, K, H]
    drafting = [i for i, d in enumerate(draft_rows) if d.num_drafts > 0]
    out = [Proposal((), None)] * n
    if drafting:
        index = upload(drafting, ex.device)
        made = drafter.proposals([draft_rows[i] for i in drafting], hidden.index_select(0, index))
        for i, proposal in zip(drafting, made, strict=True):
            out[i] = proposal
    return out
