"""Verification of speculative drafts: which drafted tokens a row keeps, and the one token after them.

Owns: the acceptance rule. Given, per row, the target model's logits at its k + 1 verified positions
(the position before the first draft, then one per draft) and the k drafts, it returns the tokens to
commit (the accepted drafts, then one token drawn from the target) and how many drafts were accepted.
Must not touch: the model, the cache, requests; it sees logits, token ids and `SamplingParams`.

Both rules read the SAME processed distribution the plain sampler draws from
(`engine.sampling.processed_distribution`: penalties, temperature, top-k, top-p, min-p), at every
position with that position's own penalty counts (the output so far plus the drafts before it), so the
committed tokens follow exactly the distribution a non-speculative run samples:

- greedy (temperature 0): accept while the draft equals the target's argmax; then the argmax at the
  first mismatch (or after the last draft). The tokens are exactly those of a non-speculative run.
- sampled: standard speculative rejection sampling (Leviathan et al. 2023; Chen et al. 2023). Draft
  d_j was drawn from the drafter's processed distribution q_j; it is accepted with probability
  min(1, p_j(d_j) / q_j(d_j)). At the first rejection the token is drawn from the residual
  norm(max(p_j - q_j, 0)); after k acceptances the bonus token is drawn from p_k. Each row's draws
  come from its request's generator (a seeded request stays reproducible, independent of the batch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate

import torch

from engine.request import SamplingParams
from engine.sampling import output_token_counts, penalized, processed_distribution
from engine.transfer import upload

GeneratorFor = Callable[[str, int | None], torch.Generator]  # (request_id, seed) -> generator


@dataclass(frozen=True, slots=True)
class Verdict:
    """One row's outcome: `tokens` = accepted drafts then one target token; `num_accepted` drafts kept."""

    tokens: tuple[int, ...]
    num_accepted: int


def _position_counts(
    history: Sequence[Sequence[int]], drafts: Sequence[Sequence[int]], vocab: int, device: torch.device
) -> torch.Tensor:
    """Penalty counts per verified position: row i's position j sees its output so far plus drafts[:j]."""
    per_position = [
        list(h) + list(d[:j]) for h, d in zip(history, drafts, strict=True) for j in range(len(d) + 1)
    ]
    return output_token_counts(per_position, vocab, device)


def verify(
    target_logits: torch.Tensor,  # [sum over rows of (k_i + 1), V], rows in order, positions in order
    drafts: Sequence[Sequence[int]],  # per row its k_i drafts (k_i may be 0: a plain sample)
    draft_probs: Sequence[torch.Tensor | None],  # per row [k_i, V] q of its drafts (None: greedy or k_i=0)
    params: Sequence[SamplingParams],
    request_ids: Sequence[str],
    generator: GeneratorFor,
    history: Sequence[Sequence[int]] | None = None,  # per row its output tokens so far (penalties)
) -> list[Verdict]:
    """The verdict of every row (see the module docstring for the rules)."""
    sizes = [len(d) + 1 for d in drafts]
    assert target_logits.shape[0] == sum(sizes), f"{target_logits.shape[0]} logits rows for positions {sizes}"
    position_params = [p for p, n in zip(params, sizes, strict=True) for _ in range(n)]
    counts = None
    if penalized(params):
        hist = history if history is not None else [()] * len(drafts)
        counts = _position_counts(hist, drafts, target_logits.shape[-1], target_logits.device)
    greedy_tokens, probs = processed_distribution(target_logits, position_params, counts)
    argmax = greedy_tokens.tolist()  # the one host copy of a greedy step
    offsets = [0, *accumulate(sizes)][:-1]
    sampled = [i for i, p in enumerate(params) if p.temperature != 0.0 and probs is not None]
    verdicts: dict[int, Verdict] = {}
    if sampled:
        assert probs is not None
        gens = [generator(request_ids[i], params[i].seed) for i in sampled]
        rows = [(probs[offsets[i] : offsets[i] + sizes[i]], draft_probs[i], drafts[i]) for i in sampled]
        verdicts = dict(zip(sampled, _rejection(rows, gens), strict=True))
    out: list[Verdict] = []
    for i, row_drafts in enumerate(drafts):
        if i in verdicts:
            out.append(verdicts[i])
            continue
        k, offset, a = len(row_drafts), offsets[i], 0
        while a < k and row_drafts[a] == argmax[offset + a]:
            a += 1
        out.append(Verdict((*row_drafts[:a], argmax[offset + a]), a))
    return out


def _rejection(
    rows: Sequence[
        tuple[torch.Tensor, torch.Tensor | None, Sequence[int]]
    ],  # (p [k+1, V], q [>=k, V], drafts)
    gens: Sequence[torch.Generator],
) -> list[Verdict]:
    """Rejection sampling for rows padded to the longest draft (one host copy for all of them).

    q is zero-padded past each row's drafts, so the residual max(p_a - q_a, 0) at a == k is p_k itself:
    the bonus token and the correction token are one draw."""
    num_rows, vocab = len(rows), rows[0][0].shape[-1]
    device = rows[0][0].device
    k_max = max(max(len(d) for _, _, d in rows), 1)  # at least one column: rows without drafts
    p = torch.zeros(num_rows, k_max + 1, vocab, device=device)
    q = torch.zeros(num_rows, k_max + 1, vocab, device=device)
    index_cpu = [[0] * k_max for _ in rows]
    num_drafts_cpu = [len(d) for _, _, d in rows]
    for r, (p_row, q_row, drafts) in enumerate(rows):
        k = len(drafts)
        assert k == 0 or (q_row is not None and q_row.shape[0] >= k), f"{k} drafts without their q"
        p[r, : k + 1] = p_row
        if k:
            assert q_row is not None
            q[r, :k] = q_row[:k]
            index_cpu[r][:k] = list(drafts)
    u = torch.zeros(num_rows, k_max, device=device)
    noise = torch.empty(num_rows, vocab, device=device)
    for r, gen in enumerate(gens):  # each row's draws from its own request's generator
        if num_drafts_cpu[r]:
            u[r].uniform_(generator=gen)
        noise[r].exponential_(generator=gen)
    both = upload([*num_drafts_cpu, *(t for row in index_cpu for t in row)], device)  # one copy, no wait
    num_drafts, index = both[:num_rows], both[num_rows:].view(num_rows, k_max)
    first, final = rejection_on_device(p, q, index, num_drafts, u, noise)
    host = torch.stack([first, final]).tolist()  # the one host copy
    return [Verdict((*drafts[:a], t), a) for (_, _, drafts), a, t in zip(rows, host[0], host[1], strict=True)]


def rejection_on_device(
    p: torch.Tensor,  # [R, k + 1, V] the target's processed distributions at the verified positions
    q: torch.Tensor,  # [R, k + 1, V] the drafts' q, zero past each row's drafts
    drafts: torch.Tensor,  # [R, k] int64 the drafted tokens
    num_drafts: torch.Tensor,  # [R] int64 drafts per row (the columns past them are padding)
    u: torch.Tensor,  # [R, k] uniform [0, 1) draws
    noise: torch.Tensor,  # [R, V] Exp(1) draws
) -> tuple[torch.Tensor, torch.Tensor]:
    """The acceptance rule on device tensors, nothing read back: (accepted count [R], the token after the accepted
    drafts [R]). Draft j is rejected when u_j * q_j(d_j) >= p_j(d_j) (accepted with probability min(1, p / q)); the
    token is drawn from the residual norm(max(p_a - q_a, 0)) at the first rejection a, or from p_k when every
    draft is kept (q_k is zero there), by the exponential race argmax(residual / Exp(1)). A row whose p and q are
    one-hot (greedy: p at the argmax, q at the draft) accepts exactly the drafts equal to the argmax."""
    vocab, k_max = p.shape[-1], drafts.shape[1]
    positions = torch.arange(k_max, device=p.device)
    p_d = p[:, :-1].gather(2, drafts[:, :, None]).squeeze(2)
    q_d = q[:, :-1].gather(2, drafts[:, :, None]).squeeze(2)
    reject = (u * q_d >= p_d) & (positions[None, :] < num_drafts[:, None])
    first = torch.where(reject.any(dim=1), reject.int().argmax(dim=1), num_drafts)  # [R] accepted count
    pick = first[:, None, None].expand(-1, 1, vocab)
    p_a, q_a = p.gather(1, pick).squeeze(1), q.gather(1, pick).squeeze(1)
    residual = (p_a - q_a).clamp_(min=0.0)
    residual = torch.where(residual.sum(dim=1, keepdim=True) > 0, residual, p_a)  # p == q: draw from p
    return first, (residual / noise).argmax(dim=1)


def _draws(
    gens: Sequence[torch.Generator | None], cols: int, device: torch.device, exponential: bool
) -> torch.Tensor:
    """[len(gens), cols] draws, row r from `gens[r]` (Exp(1) or uniform [0, 1)); a None row (greedy) gets ones
    (Exp) or zeros (uniform). Consecutive rows of one generator draw in one launch: the whole batch when no request is
    seeded, a request's K positions of a DFlash block."""
    out = (torch.ones if exponential else torch.zeros)(len(gens), cols, device=device)
    start = 0
    while start < len(gens):
        gen, end = gens[start], start + 1
        while end < len(gens) and gens[end] is gen:
            end += 1
        if gen is not None and exponential:
            out[start:end].exponential_(generator=gen)
        elif gen is not None:
            out[start:end].uniform_(generator=gen)
        start = end
    return out


def _one_hot(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """[*tokens.shape, vocab] float32."""
    out = torch.zeros(*tokens.shape, vocab, device=tokens.device)
    return out.scatter_(-1, tokens[..., None], 1.0)


def verify_on_device(
    logits: torch.Tensor,  # [n * w, V] the target's logits, row by row, w = k + 1 positions each
    fed: torch.Tensor,  # [n, w] int64 each row's fed tokens: its last token, then its k drafts
    draft_probs: Sequence[torch.Tensor | None],  # per row q of its drafts [>= k, V] (None: a greedy row)
    params: Sequence[SamplingParams],  # per row
    gens: Sequence[torch.Generator | None],  # per row its request's generator (None: a greedy row)
    counts: torch.Tensor | None = None,  # [n, V] each row's output-token counts before the round (penalties)
) -> tuple[torch.Tensor, torch.Tensor]:
    """`verify` over rows of one width without a host read: (accepted [n], token after them [n]) on the device.
    The same processed distributions (position j's penalty counts: the output so far plus drafts[:j]), the same
    rule (`rejection_on_device`); a greedy row's p and q are one-hot (its argmax, its draft), so it keeps the
    drafts equal to the argmax and then takes the argmax."""
    n, w = fed.shape
    k, vocab, device = w - 1, logits.shape[-1], logits.device
    drafts = fed[:, 1:]
    position_params = [p for p in params for _ in range(w)]
    position_counts = None
    if counts is not None and penalized(params):
        seen = torch.cat([torch.zeros(n, 1, vocab, device=device), _one_hot(drafts, vocab).cumsum(dim=1)], 1)
        position_counts = (counts[:, None] + seen).view(n * w, vocab)
    greedy_tokens, probs = processed_distribution(logits, position_params, position_counts)
    greedy = [p.temperature == 0.0 for p in params]
    p = _one_hot(greedy_tokens, vocab)
    if probs is not None:
        greedy_rows = upload([g for g in greedy for _ in range(w)], device, torch.bool)
        p = torch.where(greedy_rows[:, None], p, probs)
    q_rows = []
    for r, q_r in enumerate(draft_probs):
        if greedy[r] or q_r is None:
            assert greedy[r], "a sampled row's drafts without their q"
            q_rows.append(_one_hot(drafts[r], vocab))
        else:
            q_rows.append(q_r[:k])
    q = torch.cat([torch.stack(q_rows), torch.zeros(n, 1, vocab, device=device)], dim=1)
    u = _draws(gens, k, device, exponential=False)
    noise = _draws(gens, vocab, device, exponential=True)
    num_drafts = torch.full((n,), k, dtype=torch.long, device=device)
    return rejection_on_device(p.view(n, w, vocab), q, drafts, num_drafts, u, noise)


def draft_on_device(
    logits: torch.Tensor,  # [B, V] the drafter's logits for one draft position
    params: Sequence[SamplingParams],
    gens: Sequence[torch.Generator | None],  # per row its request's generator (None: a greedy row)
    counts: torch.Tensor | None = None,  # [B, V] per row: output so far plus earlier drafts (penalties)
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One draft per row from the drafter's processed distribution q, on the device: (tokens [B], q [B, V] or None
    when every row is greedy). Greedy rows take the argmax, sampled rows the exponential race over q."""
    greedy_tokens, probs = processed_distribution(logits, params, counts)
    if probs is None:
        return greedy_tokens, None
    sampled = (probs / _draws(gens, probs.shape[-1], probs.device, exponential=True)).argmax(dim=-1)
    greedy = upload([p.temperature == 0.0 for p in params], logits.device, torch.bool)
    return torch.where(greedy, greedy_tokens, sampled), probs


def draft_tokens(
    logits: torch.Tensor,  # [B, V] the drafter's logits for one draft position of B rows
    params: Sequence[SamplingParams],
    request_ids: Sequence[str],
    generator: GeneratorFor,
    history: Sequence[Sequence[int]] | None = None,  # per row: output so far plus earlier drafts
) -> tuple[list[int], torch.Tensor | None]:
    """One draft per row from the drafter's processed distribution q (the same warpers as the target):
    greedy rows take the argmax, sampled rows draw from q. Returns (tokens, q [B, V] or None when every
    row is greedy); verification needs q of the drawn tokens."""
    counts = None
    if history is not None and penalized(params):
        counts = output_token_counts(history, logits.shape[-1], logits.device)
    gens = [
        None if p.temperature == 0.0 else generator(r, p.seed)
        for p, r in zip(params, request_ids, strict=True)
    ]
    tokens, probs = draft_on_device(logits, params, gens, counts)
    return tokens.tolist(), probs
