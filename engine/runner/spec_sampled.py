"""The sampled speculative rounds with one host wait (`NINFER_SPEC_ONE_WAIT_SAMPLED`, engine/env.py): the one-wait
rounds of engine/runner/spec_round.py (MTP) and engine/runner/dflash_round.py (DFlash) for verify rows that sample
(temperature, top-k, top-p, min-p) or carry a presence / frequency penalty, which the server's default sampling
presets do (engine/sampling.py).

Everything the general round reads back between its steps stays on the device:

- the verdict (`sampled_verdict`, both drafters): `engine.spec.verify.verify_on_device` (the general round's
  processed distributions and rejection rule, `rejection_on_device`, on device tensors): p_j at the k + 1 verified
  positions, q_j of the drafts kept on the device since they were drawn (`SpecExecutor._draft_probs`), acceptance
  u_j * q_j(d_j) < p_j(d_j) in order, the token after them from the residual norm(max(p_a - q_a, 0)) or, all kept,
  from p_k; greedy rows of the batch as one-hot p and q (the greedy rule);
- penalty counts: each row's output-token counts before the round: the counts kept on the device after its last
  sampled round plus the tokens committed since (one copy; the host history is complete since the previous round's
  one wait); position j adds drafts[:j]; after the verdict the committed tokens (accepted drafts, then the bonus);
- rollback (`roll_back`), then the drafter: MTP's catch-up as in spec_round.py (`catch_up`) and its chained draft
  steps, draft j + 1 counting the drafts before it; DFlash's block on its static buffers (dflash_round.py), every
  position counting the committed output only, as its eager drafter (`DFlashDrafter.proposals`);
- the next drafts drawn from the drafter's processed distributions (`draft_on_device`: the exponential race), their
  q kept on the device for the next round.

The one copy is (accepted, bonus, drafts) per row (`finish_sampled`, both drafters). Each row's draws come from its
request's generator (one launch for the batch when no row is seeded). Rows take these rounds when all are verify rows
of one width that fit the static buffers, need nothing host-side (no grammar, no logprobs) and every sampled row's
drafts have their q (drafted with these params); otherwise the general round. Stop tokens are the scheduler's: it
trims after the copy, as after the general round. Owns nothing; must not touch requests or the scheduler.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch

from engine.request import SamplingParams
from engine.runner.spec_round import (
    OneWaitRows,
    Outcome,
    catch_up,
    commit,
    draft_limits,
    one_wait_rows,
    roll_back,
    round_inputs,
)
from engine.sampling import output_token_counts, penalized
from engine.spec.draft_head import proposal_logits
from engine.spec.graphs import DevicePatch, StaticRow
from engine.spec.mtp import MtpDrafter
from engine.spec.verify import draft_on_device, verify_on_device
from engine.step import RowPlan

if TYPE_CHECKING:
    from engine.runner.speculative import SpecExecutor


def host_free(params: SamplingParams) -> bool:
    """Rows the sampled one-wait rounds take: nothing the runner's sampler must see (grammar, logprobs)."""
    return params.structured is None and params.logprobs is None


def drafts_have_q(ex: SpecExecutor, rows: Sequence[RowPlan]) -> bool:
    """Every sampled row's drafts kept their q (drawn by the drafter with these params), one per fed draft."""
    k = rows[0].num_tokens - 1
    for row in rows:
        if row.sampling_params.temperature != 0.0:
            q = ex.draft_probs(row.request_id)
            if q is None or q.shape[0] < k:
                return False
    return True


def sampled_rows(ex: SpecExecutor, rows: Sequence[RowPlan]) -> OneWaitRows | None:
    """The static rows of the sampled one-wait MTP round over `rows`, or None when they do not take it (see the
    module docstring)."""
    static = one_wait_rows(ex, rows, host_free)
    return static if static is not None and drafts_have_q(ex, rows) else None


def _round_counts(
    ex: SpecExecutor, rows: Sequence[RowPlan], history: dict[str, list[int]], vocab: int
) -> torch.Tensor:
    """Each row's output-token counts before the round [n, V] on the device: the counts kept after the row's last
    sampled round plus the tokens since (other rounds' commits), or, when its output changed under them (the
    thinking budget's forced close replaces the last token, `ModelRunner._take_forced_tokens`: the last counted
    token differs), all of it. The output only grows otherwise; the new tokens go up in one copy."""
    kept: list[torch.Tensor | None] = []
    new: list[list[int]] = []
    for row in rows:
        h = history.get(row.request_id, [])
        last = ex.penalty_counts.get(row.request_id)
        if last is not None and 0 < last[0] <= len(h) and h[last[0] - 1] == last[1]:
            kept.append(last[2])
            new.append(h[last[0] :])
        else:
            kept.append(None)
            new.append(h)
    counts = output_token_counts(new, vocab, ex.device)
    if any(t is not None for t in kept):
        zero = counts.new_zeros(vocab)
        counts += torch.stack([zero if t is None else t for t in kept])
    return counts


class SampledVerdict(NamedTuple):
    """A sampled round's verdict on the device, its rollback queued: per row [n] the drafts accepted, the token
    after them, the fed tokens [n, w], working slots, start positions, page capacities; the output-token counts
    after the round's commits [n, V] (None: no row is penalized); each row's params and generator."""

    accepted: torch.Tensor
    bonus: torch.Tensor
    fed: torch.Tensor
    slots: torch.Tensor
    starts: torch.Tensor
    capacity: torch.Tensor
    counts: torch.Tensor | None
    params: list[SamplingParams]
    gens: list[torch.Generator | None]


def sampled_verdict(
    ex: SpecExecutor, rows: Sequence[RowPlan], target_hidden: torch.Tensor, history: dict[str, list[int]]
) -> SampledVerdict:
    """Verification (`verify_on_device`) and rollback of verify rows of one width, nothing read back; both
    drafters' sampled rounds start here. `target_hidden` [n * w, H]: the verify's final hidden states."""
    n, width, model = len(rows), rows[0].num_tokens, ex.model
    params = [row.sampling_params for row in rows]
    gens = [
        None if p.temperature == 0.0 else ex.generator(row.request_id, p.seed)
        for row, p in zip(rows, params, strict=True)
    ]
    fed, snap, slots, starts, capacity = round_inputs(ex, rows, width)
    logits = model.compute_logits(target_hidden)
    # the counts as wide as the head's logits (the vocabulary; a test's restricted head: its own)
    counts = _round_counts(ex, rows, history, logits.shape[-1]) if penalized(params) else None
    accepted, bonus = verify_on_device(
        logits, fed, [ex.draft_probs(row.request_id) for row in rows], params, gens, counts
    )
    roll_back(ex, accepted, width, snap, slots)
    if counts is not None:  # + the committed tokens: the drafts kept, then the bonus
        kept = (torch.arange(width - 1, device=ex.device)[None, :] < accepted[:, None]).float()
        counts = counts.index_put_(
            (torch.arange(n, device=ex.device), bonus), torch.ones(n, device=ex.device), accumulate=True
        )
        counts.scatter_add_(1, fed[:, 1:], kept)
    return SampledVerdict(accepted, bonus, fed, slots, starts, capacity, counts, params, gens)


def finish_sampled(
    ex: SpecExecutor,
    rows: Sequence[RowPlan],
    verdict: SampledVerdict,
    drafts: torch.Tensor,
    q: torch.Tensor | None,
    history: dict[str, list[int]],
    limits: Callable[[list[list[int]]], Sequence[int]],
) -> Outcome:
    """The one wait of a sampled round and its host side: (accepted, bonus, `drafts` [n, K]) per row in one copy,
    committed (`history` extended), each row's counts kept for its next round, each sampled row's `q` [n, K, V]
    kept for the next verify. `limits(verdict rows)`: the drafts each row may propose."""
    out = torch.cat(
        [verdict.accepted[:, None], verdict.bonus[:, None], drafts], dim=1
    ).tolist()  # the one wait
    outcome = commit(ex, rows, out, history, limits(out))
    if verdict.counts is not None:  # the counts of each row's output after this round, for the next one
        for i, row in enumerate(rows):
            h = history[row.request_id]
            ex.penalty_counts[row.request_id] = (len(h), h[-1], verdict.counts[i])
    if q is not None:
        for i, (row, p) in enumerate(zip(rows, verdict.params, strict=True)):
            if p.temperature != 0.0:
                ex.keep_draft_probs(row.request_id, q[i])
    return outcome


def run_sampled(
    ex: SpecExecutor, rows: Sequence[RowPlan], static: OneWaitRows, history: dict[str, list[int]]
) -> Outcome:
    """One MTP round over `rows` (`static`: their `sampled_rows`); `history` gets each row's committed tokens, the
    executor each sampled row's new drafts' q."""
    graphs, drafter, model = ex.graphs, ex.drafter, ex.model
    assert graphs is not None and isinstance(drafter, MtpDrafter)
    n, width, k = len(rows), rows[0].num_tokens, ex.k
    verify_rows, catch_up_rows = static
    target_hidden = graphs.target(verify_rows, width)  # [n * width, H]
    ex.num_verify_forwards += 1
    v = sampled_verdict(ex, rows, target_hidden, history)
    hidden = catch_up(ex, rows, catch_up_rows, target_hidden, v.accepted, v.bonus, v.slots)
    counts = v.counts
    draft, q = draft_on_device(proposal_logits(model, hidden), v.params, v.gens, counts)
    drafts, qs = [draft], [q]
    pos = v.starts + v.accepted  # each row's last pair
    steps = [StaticRow((0,), row.start_pos, row.page_ids) for row in rows]
    for j in range(1, k):
        move = DevicePatch(positions=pos + j, capacity=v.capacity)
        hidden, logits = graphs.draft(steps, hidden, drafts[-1], move)
        if counts is not None:  # draft j + 1 also counts the drafts before it
            counts = counts.scatter_add(1, drafts[-1][:, None], torch.ones(n, 1, device=ex.device))
        draft, q = draft_on_device(logits, v.params, v.gens, counts)
        drafts.append(draft)
        qs.append(q)
    q_all = torch.stack([q for q in qs if q is not None], dim=1) if qs[0] is not None else None  # [n, k, V]
    return finish_sampled(
        ex, rows, v, torch.stack(drafts, dim=1), q_all, history, lambda out: draft_limits(ex, rows, out)
    )
