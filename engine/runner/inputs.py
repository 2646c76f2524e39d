"""Step inputs: the eager batch built from a plan's rows, and the static buffers a captured graph reads.

Owns: turning plain row ints into a `ForwardBatch` (eager steps: fresh tensors each step) and the
persistent `InputBuffers` of CUDA-graph steps (filled in place each step; see engine/runner/graphs.py
for the padding scheme), plus which token rows of a step's hidden states give logits.
Must not touch: the model, the cache tensors, the scheduler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.model.forward import ForwardBatch, make_forward_batch
from engine.runner.pending import upload
from engine.step import PREVIOUS_TOKEN, RowPlan


def eager_batch(rows: Sequence[RowPlan], page_size: int, device: torch.device) -> ForwardBatch:
    """One flat varlen batch over every row (prefill chunks, decode tokens, mixed)."""
    return make_forward_batch(
        [row.token_ids for row in rows],
        [row.start_pos for row in rows],
        [row.page_ids for row in rows],
        [row.state_slot for row in rows],
        page_size=page_size,
        has_initial_state=[not row.reset_state for row in rows],
        device=device,
    )


def sample_indices(rows: Sequence[RowPlan]) -> list[int]:
    """Token rows (in the flat batch) whose logits a step samples: each row's last `num_sample` positions,
    in row then position order."""
    out: list[int] = []
    end = 0
    for row in rows:
        end += row.num_tokens
        out.extend(range(end - row.num_sample, end))
    return out


@dataclass(frozen=True)
class DecodeRow:
    """One decode row in plain ints: feed ``token`` at ``position`` of a sequence whose KV pages are
    ``page_ids`` and whose GDN state is ``state_slot`` (``keep_state`` False = start from zeros).
    ``token`` is ``PREVIOUS_TOKEN`` when the id comes from the previous step's sampled ids on the device, at
    ``previous_index``. ``rope_delta``: a request with media rotates by ``position + rope_delta``
    (engine/runner/media.py)."""

    token: int
    position: int
    page_ids: Sequence[int]
    state_slot: int
    keep_state: bool = True
    previous_index: int = -1
    rope_delta: int = 0

    @classmethod
    def of(cls, row: RowPlan, previous_index: int = -1) -> DecodeRow:
        assert row.num_tokens == 1, f"{row.request_id}: a decode row feeds one token, not {row.num_tokens}"
        assert (row.token_ids[0] == PREVIOUS_TOKEN) == (previous_index >= 0), (
            f"{row.request_id}: previous index"
        )
        return cls(
            row.token_ids[0], row.start_pos, row.page_ids, row.state_slot, not row.reset_state, previous_index
        )


@dataclass
class InputBuffers:
    """Persistent device buffers a captured decode step reads (engine/runner/graphs.py says how)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    page_table: torch.Tensor
    slot_mapping: torch.Tensor
    state_slots: torch.Tensor
    has_initial_state: torch.Tensor

    @classmethod
    def allocate(cls, max_batch: int, max_pages: int, device: torch.device) -> InputBuffers:
        def ints(n: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.zeros(n, dtype=dtype, device=device)

        return cls(
            input_ids=ints(max_batch),
            positions=ints(max_batch),
            query_start_loc=torch.arange(max_batch + 1, dtype=torch.int32, device=device),
            seq_lens=torch.ones(max_batch, dtype=torch.int32, device=device),
            page_table=torch.zeros(max_batch, max_pages, dtype=torch.int32, device=device),
            slot_mapping=torch.full((max_batch,), -1, dtype=torch.int64, device=device),
            state_slots=torch.full((max_batch,), -1, dtype=torch.int64, device=device),
            has_initial_state=torch.zeros(max_batch, dtype=torch.bool, device=device),
        )

    def batch(self, size: int) -> ForwardBatch:
        """The ForwardBatch of a graph of ``size`` rows: views of the first ``size`` rows."""
        return ForwardBatch(
            input_ids=self.input_ids[:size],
            positions=self.positions[:size],
            query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=self.seq_lens[:size],
            page_table=self.page_table[:size],
            slot_mapping=self.slot_mapping[:size],
            state_slots=self.state_slots[:size],
            has_initial_state=self.has_initial_state[:size],
        )

    def reset_padding(self, start: int) -> None:
        """Rows ``start ..`` become padding rows (graphs.py: write no KV, touch no state)."""
        for t, value in ((self.slot_mapping, -1), (self.state_slots, -1), (self.seq_lens, 1), (self.input_ids, 0),
                         (self.positions, 0), (self.has_initial_state, False)):  # fmt: skip
            t[start:].fill_(value)

    def fill(
        self,
        rows: Sequence[DecodeRow],
        page_size: int,
        row_pages: list[Sequence[int] | None],
        previous: torch.Tensor | None = None,  # [S] ids the previous step sampled (rows' previous_index)
    ) -> None:
        """Write ``rows`` into rows 0..len(rows)-1 without a host sync (pinned, non-blocking uploads; page-table
        rows only when a lane's pages changed: ``row_pages`` remembers what each table row holds)."""
        num_rows = len(rows)
        device = self.input_ids.device
        slots = [r.page_ids[r.position // page_size] * page_size + r.position % page_size for r in rows]
        dev = upload(
            [[max(r.token, 0) for r in rows], [r.position + r.rope_delta for r in rows], [r.position + 1 for r in rows], slots,
             [r.state_slot for r in rows], [int(r.keep_state) for r in rows], [r.previous_index for r in rows]],
            device,
        )  # fmt: skip
        ids = dev[0]
        if any(r.previous_index >= 0 for r in rows):
            assert previous is not None, "a row feeds the previous step's token, and none is given"
            ids = torch.where(dev[6] >= 0, previous[dev[6].clamp(min=0)], ids)
        changed = [i for i, r in enumerate(rows) if row_pages[i] != r.page_ids]
        if changed:  # page-table rows change only when a lane's request changes or its row grows
            width = max(len(rows[i].page_ids) for i in changed)
            table = upload(
                [[i, *rows[i].page_ids] + [0] * (width - len(rows[i].page_ids)) for i in changed], device
            )
            self.page_table[table[:, 0], :width] = table[:, 1:].to(self.page_table.dtype)
            for i in changed:
                row_pages[i] = rows[i].page_ids
        self.input_ids[:num_rows].copy_(ids)
        self.positions[:num_rows].copy_(dev[1])
        self.seq_lens[:num_rows].copy_(dev[2])
        self.slot_mapping[:num_rows].copy_(dev[3])
        self.state_slots[:num_rows].copy_(dev[4])
        self.has_initial_state[:num_rows].copy_(dev[5].bool())
