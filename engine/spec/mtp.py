"""The MTP drafter: K draft tokens per lane from the target's last hidden state and the MTP layer.

Owns: the per-slot continuation hidden state (``hidden[slot]``: the target's final hidden state at a
sequence's last computed position, registered in the cache's ``slot_extras`` beside the GDN state of the
same slot, so prefix checkpoints, host parking and restores carry it and count its bytes) and the MTP
layer's forward passes (through engine/spec/graphs.py's static buffers / CUDA graphs when they fit). The MTP
layer's KV lives in the model's cache (the entry after the attention layers), in the same pages as the
sequence's main KV, so prefix reuse and host parking of pages carry it too. Must not touch: requests, the
scheduler, page ownership.

The MTP pair at position p is (target hidden h_p, token x_{p+1}); its output predicts x_{p+2}. Between
steps a sequence with computed positions [0, e) holds MTP KV for pairs [0, e - 2] and ``hidden[slot] =
h_{e-1}`` (it may also hold pair e - 1). A step that computed positions [s, s + v) (after rollback)
writes, in one varlen MTP pass over all rows ("catch-up"):

    pairs  s-1 (h_{s-1} from hidden[slot], x_s)   s .. s+v-2 (h_p, the fed x_{p+1})   s+v-1 (h, bonus)
           only when s > 0                                                           only when sampled

and stores h_{s+v-1} in ``hidden[slot]``. A sampling row then drafts: the catch-up output of its last
pair gives draft 1; each further draft is one single-token MTP step at the next position, fed the
previous draft and the previous MTP output (vLLM's MTP chaining). Those chained pairs write MTP KV past
the verified frontier with a draft's hidden; the next catch-up overwrites every such position before
any MTP query reads it. Drafts stop at the row's page capacity (never a write outside its pages).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.model.forward import ModelCache, make_forward_batch
from engine.model.qwen3_5 import Qwen3_5ForCausalLM
from engine.request import SamplingParams
from engine.spec.draft_head import proposal_logits
from engine.spec.graphs import SpecGraphs, StaticRow
from engine.spec.verify import GeneratorFor, draft_tokens
from engine.transfer import upload


@dataclass(frozen=True, slots=True)
class DraftRow:
    """One row's verified outcome, in plain ints (the runner builds it after verification)."""

    request_id: str
    page_ids: Sequence[int]
    state_slot: int
    start_pos: int  # s: position of the first fed token
    tokens: Sequence[int]  # the fed tokens that stay computed (after rollback), v >= 1 of them
    hidden_rows: Sequence[int]  # their rows in the step's target hidden states
    bonus: int | None  # the token sampled after them (None: a prefill chunk that samples nothing)
    num_drafts: int  # drafts wanted (0: catch-up only)
    params: SamplingParams
    history: Sequence[int]  # the request's output tokens so far, bonus included (penalties)


@dataclass(frozen=True, slots=True)
class Proposal:
    tokens: tuple[int, ...]
    probs: torch.Tensor | None  # [len(tokens), V] the drafter's processed q (None: greedy row)


def device_draftable(params: SamplingParams) -> bool:
    """A row whose drafts are its drafter's argmax with nothing from the host in between (no penalties)."""
    return params.temperature == 0.0 and not params.presence_penalty and not params.frequency_penalty


class MtpDrafter:
    """Use: ``advance(rows, hidden)`` once per step after verification; ``copy_slot`` beside state copies."""

    def __init__(self, model: Qwen3_5ForCausalLM, cache: ModelCache, num_slots: int, generator: GeneratorFor):
        if model.mtp is None:
            raise ValueError("--spec mtp: the model was loaded without its MTP head")
        if len(cache.key_cache) <= model.config.num_attention_layers:
            raise ValueError("--spec mtp: the cache has no KV entry for the MTP layer (allocate with_mtp)")
        param = next(model.parameters())
        self.model, self.cache, self.generator = model, cache, generator
        self.page_size = cache.page_size
        self.hidden = torch.zeros(num_slots, model.config.hidden_size, dtype=param.dtype, device=param.device)
        cache.slot_extras.append(self.hidden)  # host parking parks and restores it with the slot's GDN state
        self.graphs: SpecGraphs | None = None  # static buffers / CUDA graphs (set by the runner)

    def copy_slot(self, src: int, dst: int) -> None:
        self.hidden[dst].copy_(self.hidden[src])

    def _static(
        self, tokens: Sequence[Sequence[int]], starts: Sequence[int], rows: Sequence[DraftRow], width: int
    ) -> list[StaticRow] | None:
        """The forward's rows for the static path, or None when it has none or they do not fit it."""
        if self.graphs is None:
            return None
        static = [StaticRow(t, s, r.page_ids) for t, s, r in zip(tokens, starts, rows, strict=True)]
        return static if self.graphs.fits(static, width) else None

    def _forward(
        self,
        tokens: Sequence[Sequence[int]],
        starts: Sequence[int],
        rows: Sequence[DraftRow],
        hidden: torch.Tensor,
    ) -> torch.Tensor:
        static = self._static(tokens, starts, rows, 0)
        if static is not None:
            assert self.graphs is not None
            return self.graphs.catch_up(static, hidden)
        batch = make_forward_batch(
            tokens, starts, [r.page_ids for r in rows], [r.state_slot for r in rows], self.page_size,
            device=hidden.device,
        )  # fmt: skip
        return self.model.forward_mtp(batch, hidden, self.cache)

    def advance(self, rows: Sequence[DraftRow], target_hidden: torch.Tensor) -> list[Proposal]:
        """Catch the MTP KV up with every row's verified positions, store each row's continuation hidden
        state, and propose each sampling row's drafts. Returns one `Proposal` per row (empty: none).

        Every index into the device tensors goes up through `upload` (pinned, non-blocking): indexing with a
        host list would copy it with a stream sync. The drafts' host copy is the drafter's one wait."""
        out = [Proposal((), None)] * len(rows)
        device = target_hidden.device
        live = [i for i, r in enumerate(rows) if r.start_pos > 0 or len(r.tokens) > 1 or r.bonus is not None]
        if not rows:
            return out
        pair_tokens: list[list[int]] = []
        starts: list[int] = []
        last: list[int] = []
        order: list[int] = []  # per pair: its hidden row in cat(target_hidden, hidden[slot of each row])
        for i in live:
            r = rows[i]
            nxt = list(r.tokens[1:]) + ([r.bonus] if r.bonus is not None else [])
            rows_h = list(r.hidden_rows[: len(nxt)])
            if r.start_pos > 0:
                nxt, rows_h = [r.tokens[0], *nxt], [target_hidden.shape[0] + i, *rows_h]
            pair_tokens.append(nxt)
            starts.append(r.start_pos - 1 if r.start_pos > 0 else 0)
            order.extend(rows_h)
            last.append(len(order) - 1)
        slots = [r.state_slot for r in rows]
        src = [r.hidden_rows[len(r.tokens) - 1] for r in rows]
        index = upload([*slots, *src, *order, *last], device)  # one copy, no wait
        slots_d, src_d, order_d, last_d = index.split([len(rows), len(rows), len(order), len(last)])
        mtp_hidden = None
        if live:
            pieces = torch.cat([target_hidden, self.hidden.index_select(0, slots_d)]).index_select(0, order_d)
            mtp_hidden = self._forward(pair_tokens, starts, [rows[i] for i in live], pieces)
        # after the catch-up read it (stream order; `pieces` is a copy): the next step's continuation state
        self.hidden.index_copy_(0, slots_d, target_hidden.index_select(0, src_d))
        if mtp_hidden is not None:
            out = self._propose(rows, live, starts, pair_tokens, mtp_hidden.index_select(0, last_d), out)
        return out

    def _chain(
        self,
        feed: Sequence[Sequence[int]],
        starts: Sequence[int],
        rows: Sequence[DraftRow],
        hidden: torch.Tensor,
        token_ids: torch.Tensor
        | None = None,  # [len(rows)] the fed tokens on the device (then `feed` is ignored)
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One chained single-token MTP step: (MTP hidden, logits), a graph replay when one fits."""
        static = self._static(feed, starts, rows, 1)
        if static is not None:
            assert self.graphs is not None
            return self.graphs.draft(static, hidden, token_ids)
        batch = make_forward_batch(
            feed, starts, [r.page_ids for r in rows], [r.state_slot for r in rows], self.page_size,
            device=hidden.device,
        )  # fmt: skip
        if token_ids is not None:
            batch = dataclasses.replace(batch, input_ids=token_ids)
        out = self.model.forward_mtp(batch, hidden, self.cache)
        return out, proposal_logits(self.model, out)

    def _propose(
        self,
        rows: Sequence[DraftRow],
        live: Sequence[int],
        starts: Sequence[int],
        pair_tokens: Sequence[Sequence[int]],
        last_hidden: torch.Tensor,  # [len(live), H] the MTP output at each live row's last pair
        out: list[Proposal],
    ) -> list[Proposal]:
        drafting = [
            (n, i) for n, i in enumerate(live) if rows[i].num_drafts > 0 and rows[i].bonus is not None
        ]
        if not drafting:
            return out
        index = [n for n, _ in drafting]
        ids = [rows[i] for _, i in drafting]
        pos = [starts[n] + len(pair_tokens[n]) - 1 for n, _ in drafting]  # position of each last pair
        # Drafts past the page capacity are never proposed: chained pair j sits at pos + j.
        limit = [
            min(r.num_drafts, len(r.page_ids) * self.page_size - p) for r, p in zip(ids, pos, strict=True)
        ]
        hidden = last_hidden
        if index != list(range(last_hidden.shape[0])):
            hidden = last_hidden.index_select(0, upload(index, last_hidden.device))
        if all(device_draftable(r.params) for r in ids):
            return self._propose_on_device(rows, drafting, ids, pos, limit, hidden, out)
        tokens: list[list[int]] = [[] for _ in ids]
        probs: list[list[torch.Tensor]] = [[] for _ in ids]
        active = list(range(len(ids)))
        for j in range(max(limit)):
            if j > 0:  # one chained MTP step for the rows still drafting
                hidden, logits = self._chain(
                    [[tokens[a][-1]] for a in active], [pos[a] + j for a in active], [ids[a] for a in active], hidden
                )  # fmt: skip
            else:
                logits = proposal_logits(self.model, hidden)
            history = [list(ids[a].history) + tokens[a] for a in active]
            new, q = draft_tokens(
                logits, [ids[a].params for a in active], [ids[a].request_id for a in active], self.generator,
                history,
            )  # fmt: skip
            for k, a in enumerate(active):
                tokens[a].append(new[k])
                if q is not None:
                    probs[a].append(q[k])
            keep = [k for k, a in enumerate(active) if limit[a] > j + 1]
            if len(keep) < len(active):
                hidden = hidden.index_select(0, upload(keep, hidden.device))
            active = [active[k] for k in keep]
            if not active:
                break
        for a, (_, i) in enumerate(drafting):
            q_rows = torch.stack(probs[a]) if probs[a] and rows[i].params.temperature != 0.0 else None
            out[i] = Proposal(tuple(tokens[a]), q_rows)
        return out

    def _propose_on_device(
        self,
        rows: Sequence[DraftRow],
        drafting: Sequence[tuple[int, int]],
        ids: Sequence[DraftRow],
        pos: Sequence[int],
        limit: Sequence[int],
        hidden: torch.Tensor,
        out: list[Proposal],
    ) -> list[Proposal]:
        """`_propose` for rows that all draft greedily with nothing the host must see between drafts (no
        penalties): each draft's argmax stays on the device and feeds the next chained step, and the drafts
        reach the host in one copy at the end (instead of one wait per draft position)."""
        device = hidden.device
        active = list(range(len(ids)))
        steps: list[tuple[list[int], torch.Tensor]] = []  # (active rows, their drafts [len(active)])
        prev: torch.Tensor | None = None
        for j in range(max(limit)):
            if j > 0:
                assert prev is not None
                hidden, logits = self._chain(
                    [[0] for _ in active], [pos[a] + j for a in active], [ids[a] for a in active], hidden, prev
                )  # fmt: skip
            else:
                logits = proposal_logits(self.model, hidden)
            new = logits.argmax(
                dim=-1
            )  # greedy, no penalty, no grammar: processed_distribution's greedy tokens
            steps.append((active, new))
            keep = [k for k, a in enumerate(active) if limit[a] > j + 1]
            if not keep:
                break
            if len(keep) < len(active):
                index = upload(keep, device)
                hidden, new = hidden.index_select(0, index), new.index_select(0, index)
            active, prev = [active[k] for k in keep], new
        flat = torch.cat([t for _, t in steps]).tolist()  # the one wait for the drafts
        tokens: list[list[int]] = [[] for _ in ids]
        it = iter(flat)
        for step_rows, _ in steps:
            for a in step_rows:
                tokens[a].append(next(it))
        for a, (_, i) in enumerate(drafting):
            out[i] = Proposal(tuple(tokens[a]), None)
        return out
