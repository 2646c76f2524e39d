"""Presence / frequency penalty counts on the device: per penalized request, how often each token is in its output.

Owns: one float32 [rows, vocab] tensor on the model's device and the request id -> row map. Row 0 is never
handed out and stays all zeros: the positions of a batch that carry no penalty read it. A request gets a row on
its first penalized sample (the tensor doubles when every row is taken); the runner adds each sampled id to its
request's row on the device right after sampling, so the next step's penalties need nothing from the host (an
overlapped step reads them before the previous step's ids reach the host). `release` zeroes and frees the rows
of ended requests (also outside a step: the tensor is an inference tensor, so every method runs in inference
mode). Index tensors go up through pinned, non-blocking copies (engine/transfer.py `upload`).

Stream order keeps the counts right under overlap: a step's adds are queued before the next step's reads, and a
release (queued by a later plan) after the adds of the request's last (possibly wasted) row.
Must not touch: the sampler's math, the runner's host history, requests.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from engine.transfer import upload


class PenaltyCounts:
    """Use: `gather(ids)` before sampling, `add(ids, sampled)` after it, `adjust` for forced tokens, `release`."""

    def __init__(self, vocab_size: int, device: torch.device, initial_rows: int = 4) -> None:
        assert initial_rows >= 2, "row 0 is the shared zero row"
        self.vocab_size = vocab_size
        self.device = device
        self._initial_rows = initial_rows
        self.counts: torch.Tensor | None = None  # [capacity, vocab] float32, allocated on first use
        self._rows: dict[str, int] = {}
        self._free: list[int] = []  # popped from the end: the lowest row first

    @property
    def capacity(self) -> int:
        """Rows the tensor holds (the zero row included)."""
        return 0 if self.counts is None else self.counts.shape[0]

    def row_of(self, request_id: str) -> int | None:
        return self._rows.get(request_id)

    @property
    def num_requests(self) -> int:
        return len(self._rows)

    def _row(self, request_id: str) -> int:
        row = self._rows.get(request_id)
        if row is None:
            if not self._free:
                self._grow()
            row = self._rows[request_id] = self._free.pop()
        return row

    def _grow(self) -> None:
        old = self.counts
        size = self.capacity
        capacity = self._initial_rows if old is None else 2 * size
        counts = torch.zeros(capacity, self.vocab_size, dtype=torch.float32, device=self.device)
        if old is not None:
            counts[:size].copy_(old)
        self.counts = counts
        self._free.extend(reversed(range(max(size, 1), capacity)))

    @torch.inference_mode()
    def gather(self, request_ids: Sequence[str | None]) -> torch.Tensor:
        """Each position's counts [B, vocab] float32: its request's row (created, all zeros, on the request's first
        penalized sample), or zeros for a position whose request is None (no penalty)."""
        rows = [0 if rid is None else self._row(rid) for rid in request_ids]
        if self.counts is None:
            self._grow()
        assert self.counts is not None
        return self.counts.index_select(0, upload(rows, self.device))

    @torch.inference_mode()
    def add(self, request_ids: Sequence[str | None], token_ids: torch.Tensor) -> None:
        """Count `token_ids[k]` ([B] int64 on the device, position k's sampled id) in position k's request's row;
        positions whose request is None count nothing. Nothing waits for the host."""
        picks = [(k, self._row(rid)) for k, rid in enumerate(request_ids) if rid is not None]
        if not picks:
            return
        assert self.counts is not None
        index = upload([[k for k, _ in picks], [row for _, row in picks]], self.device)
        ids = token_ids[index[0]].long()
        ones = torch.ones(len(picks), dtype=torch.float32, device=self.device)
        self.counts.index_put_((index[1], ids), ones, accumulate=True)

    @torch.inference_mode()
    def adjust(self, request_id: str, removed: Sequence[int], added: Sequence[int]) -> None:
        """Host-known corrections to a request's counts (the thinking budget's forced close replacing the last
        sampled token): one less of each `removed` id, one more of each `added` id. No-op without a row."""
        row = self._rows.get(request_id)
        ids = [*removed, *added]
        if row is None or not ids:
            return
        assert self.counts is not None
        signs = [-1] * len(removed) + [1] * len(added)
        index = upload([[row] * len(ids), ids, signs], self.device)
        self.counts.index_put_((index[0], index[1]), index[2].to(torch.float32), accumulate=True)

    @torch.inference_mode()
    def release(self, request_ids: Iterable[str]) -> None:
        """Zero and free the rows of requests that ended (requests without a row are skipped)."""
        rows = [row for row in (self._rows.pop(rid, None) for rid in request_ids) if row is not None]
        if not rows:
            return
        assert self.counts is not None
        self.counts.index_fill_(0, upload(rows, self.device), 0.0)
        self._free.extend(sorted(rows, reverse=True))
