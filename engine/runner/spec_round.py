"""The greedy speculative round with one host wait: verify, acceptance, rollback, catch-up and drafts all queued on
the device, then one copy of every row's (accepted count, bonus token, next drafts) to the host.

The general round (engine/runner/speculative.py) waits twice: for the verdict, because the MTP catch-up feeds each
row's accepted tokens and its bonus token (a varlen batch whose lengths are the accepted counts), and for the
drafts. A round whose rows are all greedy verify rows of one width w = k + 1 (no penalties, no grammar, no
logprobs) that fit the static buffers (engine/spec/graphs.py) needs the first wait for nothing:

- acceptance: a = the leading drafts equal to the target's argmax (the argmax of `processed_distribution`,
  exactly what `engine.spec.verify.verify` compares), bonus = the argmax after them, both on the device;
- rollback: every row copies snapshot a of its lane into its working slot, a row that kept all its drafts its
  working slot onto itself (`ModelCache.copy_states` gathers before it scatters);
- catch-up at a fixed shape: every row feeds w + 1 pairs at positions s - 1 .. s + w - 1 (tokens: its fed tokens,
  then one more; the token of pair a + 1 is replaced by the bonus on the device). Pairs 0 .. a + 1 are the general
  round's pairs; the pairs after them come later in the same causal sequence, so they change nothing before
  them, and their MTP KV lies past the verified frontier, rewritten before any query reads it (engine/spec/mtp.py);
- the continuation hidden state h_{s+a} and the catch-up output at pair a + 1 are gathered at device indices;
- drafts: the chained draft steps run at device positions s + a + j (`DevicePatch`); a step past a row's page
  capacity stores nothing and its draft is dropped on the host, as the general round never proposes it.

The committed tokens are the target's argmax at the accepted positions either way, so the greedy output is the
general round's (and the plain decode's). Owns nothing: it runs on the `SpecExecutor`'s model, cache, drafter and
graphs. Must not touch: requests, the scheduler.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from engine.request import SamplingParams
from engine.sampling import processed_distribution
from engine.spec.draft_head import proposal_logits
from engine.spec.graphs import DevicePatch, StaticRow
from engine.spec.mtp import MtpDrafter, device_draftable
from engine.step import RowPlan
from engine.transfer import upload

if TYPE_CHECKING:
    from engine.runner.speculative import SpecExecutor

# per row: committed tokens, drafts accepted, fed positions rolled back, next drafts (`SpecOutcome`'s fields)
Outcome = tuple[tuple[tuple[int, ...], ...], tuple[int, ...], tuple[int, ...], tuple[tuple[int, ...], ...]]


def greedy_plain(params: SamplingParams) -> bool:
    # the drafter's own on-device condition, and nothing the runner's sampler must see (grammar, logprobs)
    return device_draftable(params) and params.structured is None and params.logprobs is None


# the one-wait round's fixed-shape rows: (the verify's, the catch-up's), built once a round
OneWaitRows = tuple[list[StaticRow], list[StaticRow]]


def one_wait_width(
    ex: SpecExecutor, rows: Sequence[RowPlan], plain: Callable[[SamplingParams], bool] = greedy_plain
) -> int | None:
    """The verify width of a round whose rows are all verify rows of one width whose params pass `plain` (default:
    greedy, the conditions of the module docstring before the static buffers'; DFlash's round too,
    engine/runner/dflash_round.py), else None."""
    if ex.graphs is None or not rows:
        return None
    width = rows[0].num_tokens
    if width < 2 or width > ex.k + 1:
        return None
    for row in rows:
        if row.num_tokens != width or row.num_sample != width or row.start_pos == 0 or row.reset_state:
            return None
        if not plain(row.sampling_params):
            return None
    return width


def one_wait_rows(
    ex: SpecExecutor, rows: Sequence[RowPlan], plain: Callable[[SamplingParams], bool] = greedy_plain
) -> OneWaitRows | None:
    """The static rows of the one-wait round over `rows`, or None when they do not take it (see the module
    docstring for the conditions; `plain` as in `one_wait_width`)."""
    graphs = ex.graphs
    width = one_wait_width(ex, rows, plain) if isinstance(ex.drafter, MtpDrafter) else None
    if graphs is None or width is None:
        return None
    verify = ex.static_rows(rows, width)
    if not graphs.fits(verify, width):
        return None
    catch_up = [StaticRow((*row.token_ids, 0), row.start_pos - 1, row.page_ids) for row in rows]
    return (verify, catch_up) if graphs.fits(catch_up, 0) else None


def run_one_wait(
    ex: SpecExecutor, rows: Sequence[RowPlan], static: OneWaitRows, history: dict[str, list[int]]
) -> Outcome:
    """One round over `rows` (`static`: their `one_wait_rows`); `history` gets each row's committed tokens."""
    graphs, drafter, model = ex.graphs, ex.drafter, ex.model
    assert graphs is not None and isinstance(drafter, MtpDrafter)
    width, k = rows[0].num_tokens, ex.k
    verify_rows, catch_up_rows = static
    target_hidden = graphs.target(verify_rows, width)  # [n * width, H]
    ex.num_verify_forwards += 1
    accepted, bonus, slots, starts, capacity = verdict_on_device(ex, rows, target_hidden, width)
    hidden = catch_up(ex, rows, catch_up_rows, target_hidden, accepted, bonus, slots)
    drafts = [proposal_logits(model, hidden).argmax(dim=-1)]
    pos = starts + accepted  # each row's last pair
    steps = [StaticRow((0,), row.start_pos, row.page_ids) for row in rows]
    for j in range(1, k):
        move = DevicePatch(positions=pos + j, capacity=capacity)
        hidden, logits = graphs.draft(steps, hidden, drafts[-1], move)
        drafts.append(logits.argmax(dim=-1))
    verdict = torch.stack([accepted, bonus, *drafts], dim=1).tolist()  # the one wait
    return commit(ex, rows, verdict, history, draft_limits(ex, rows, verdict))


def draft_limits(ex: SpecExecutor, rows: Sequence[RowPlan], verdict: list[list[int]]) -> list[int]:
    """The drafts each row may propose after a round (`verdict` per row [accepted, ...]): K, or fewer at the end of
    its pages (the general round never proposes a draft past them)."""
    caps = [len(row.page_ids) * ex.cache.page_size for row in rows]
    return [min(ex.k, cap - (row.start_pos + v[0])) for row, v, cap in zip(rows, verdict, caps, strict=True)]


def catch_up(
    ex: SpecExecutor,
    rows: Sequence[RowPlan],
    static: list[StaticRow],
    target_hidden: torch.Tensor,
    accepted: torch.Tensor,
    bonus: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """The MTP catch-up of a one-wait round (`static`: its fixed-shape rows) and each row's continuation state;
    returns the MTP output at each row's last kept pair [n, H] (draft 1's input)."""
    graphs, drafter = ex.graphs, ex.drafter
    assert graphs is not None and isinstance(drafter, MtpDrafter)
    n, width, device = len(rows), rows[0].num_tokens, ex.device
    # pairs s-1 .. s+width-1 of every row, the bonus at pair a + 1
    row_ids = torch.arange(n, device=device)
    pair_rows = torch.cat(
        [n * width + row_ids[:, None], row_ids[:, None] * width + torch.arange(width, device=device)], 1
    )
    pieces = torch.cat([target_hidden, drafter.hidden.index_select(0, slots)]).index_select(
        0, pair_rows.flatten()
    )
    patch = DevicePatch(token_index=row_ids * (width + 1) + accepted + 1, token_values=bonus)
    mtp_hidden = graphs.catch_up(static, pieces, patch)
    drafter.hidden.index_copy_(0, slots, target_hidden.index_select(0, row_ids * width + accepted))
    return mtp_hidden.index_select(0, row_ids * (width + 1) + accepted + 1)


def verdict_on_device(
    ex: SpecExecutor, rows: Sequence[RowPlan], target_hidden: torch.Tensor, width: int
) -> tuple[torch.Tensor, ...]:
    """Acceptance and rollback of greedy verify rows, queued on the device: (accepted [n], bonus [n], working
    slots [n], start positions [n], page capacities [n]) as device tensors."""
    argmax, _ = processed_distribution(
        ex.model.compute_logits(target_hidden), [row.sampling_params for row in rows for _ in range(width)]
    )
    fed, snap, slots, starts, capacity = round_inputs(ex, rows, width)
    # acceptance: the leading drafts equal to the target's argmax, then the argmax after them
    argmax = argmax.view(len(rows), width)
    accepted = (fed[:, 1:] == argmax[:, :-1]).long().cumprod(dim=1).sum(dim=1)  # [n]
    bonus = argmax.gather(1, accepted[:, None]).squeeze(1)
    roll_back(ex, accepted, width, snap, slots)
    return accepted, bonus, slots, starts, capacity


def round_inputs(ex: SpecExecutor, rows: Sequence[RowPlan], width: int) -> tuple[torch.Tensor, ...]:
    """A one-wait round's host values on the device in one copy, no wait: (fed tokens [n, width], each lane's
    first snapshot slot [n], working slots [n], start positions [n], page capacities [n])."""
    n, k, device = len(rows), ex.k, ex.device
    caps = [len(row.page_ids) * ex.cache.page_size for row in rows]
    host = [
        *(t for row in rows for t in row.token_ids),
        *(ex.snapshot_base + row.lane * k for row in rows),
        *(row.state_slot for row in rows),
        *(row.start_pos for row in rows),
        *caps,
    ]
    up = upload(host, device)  # one copy, no wait
    fed, snap, slots, starts, capacity = up.split([n * width, n, n, n, n])
    return fed.view(n, width), snap, slots, starts, capacity


def roll_back(
    ex: SpecExecutor, accepted: torch.Tensor, width: int, snap: torch.Tensor, slots: torch.Tensor
) -> None:
    """Every row's working slot from snapshot `accepted` of its lane, or (all kept) from itself."""
    ex.cache.copy_states(torch.where(accepted < width - 1, snap + accepted, slots), slots)


def commit(
    ex: SpecExecutor,
    rows: Sequence[RowPlan],
    verdict: list[list[int]],
    history: dict[str, list[int]],
    limits: Sequence[int],
) -> Outcome:
    """The host side of a one-wait round: `verdict` per row [accepted, bonus, *drafts] (the one copy), `limits`
    the drafts each row may propose; `history` gets each row's committed tokens."""
    width = rows[0].num_tokens
    tokens: list[tuple[int, ...]] = []
    num_accepted: list[int] = []
    rolled: list[int] = []
    proposals: list[tuple[int, ...]] = []
    ex.forget_draft_probs([row.request_id for row in rows])  # greedy drafts keep no q
    for row, (a, b, *new), limit in zip(rows, verdict, limits, strict=True):
        committed = (*row.token_ids[1 : a + 1], b)
        history.setdefault(row.request_id, []).extend(committed)
        tokens.append(committed)
        num_accepted.append(a)
        rolled.append(width - 1 - a)
        proposals.append(tuple(new[:limit]))
    return tuple(tokens), tuple(num_accepted), tuple(rolled), tuple(proposals)
