"""CUDA-graph decode: one captured graph per batch size, replayed over static input buffers.

A decode step (every row brings one token and samples) is the same ~1,300 kernels every time, so it is
captured once per batch size and replayed: no Python per layer, no launch overhead per kernel.

Static inputs (``InputBuffers``): ``input_ids``, ``positions``, ``seq_lens``, ``slot_mapping``,
``state_slots``, ``has_initial_state`` ([max_batch] each), ``page_table`` ([max_batch,
max_pages_per_seq]) and the constant ``query_start_loc`` (0, 1, .., max_batch). A graph of size ``n``
reads the first ``n`` rows of each. Page-table rows and state slots are graph *inputs*: the graph does
not depend on which pages or slots a request holds, only on the batch size and the page-table width.

Padding scheme: a step of ``n`` rows replays the smallest captured size ``m >= n`` (with the default
sizes 1..8, ``m == n``). Rows ``n .. m-1`` are padding: ``state_slots = -1`` (the conv and GDN decode
kernels write zeros and touch no state), ``slot_mapping = -1`` (``store_kv`` skips the row),
``seq_lens = 1`` and ``page_table`` row unchanged (attention reads one key of some page and its output
is discarded), ``input_ids = 0``, ``positions = 0``. Only ``logits[:n]`` is returned. A padding row
never writes the KV pool or a state slot, so it cannot disturb a live request.

Eligibility (``CudaGraphRunner.can_run``): the model is on CUDA (KV in the model dtype or int8: the int8
``store_kv`` and decode attention are Triton kernels too), every row has one token and samples, and the
batch fits a captured size and the page-table width. Anything else runs eagerly.
Nothing here knows about requests: the runner hands in plain ints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.model.forward import ForwardBatch, ModelCache
from engine.model.qwen3_5 import Qwen3_5ForCausalLM

DEFAULT_GRAPH_SIZES = (1, 2, 3, 4, 5, 6, 7, 8)


@dataclass
class InputBuffers:
    """Persistent device buffers a captured decode step reads (see the module docstring)."""

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


@dataclass(frozen=True)
class DecodeRow:
    """One decode row in plain ints: feed ``token`` at ``position`` of a sequence whose KV pages are
    ``page_ids`` and whose GDN state is ``state_slot`` (``keep_state`` False = start from zeros)."""

    token: int
    position: int
    page_ids: Sequence[int]
    state_slot: int
    keep_state: bool = True


class CudaGraphRunner:
    """Use: ``capture()`` once, then ``run(rows) -> logits [n, vocab] fp32`` for eligible decode steps."""

    def __init__(
        self,
        model: Qwen3_5ForCausalLM,
        cache: ModelCache,
        *,
        max_pages_per_seq: int,
        sizes: Sequence[int] = DEFAULT_GRAPH_SIZES,
    ) -> None:
        param = next(model.parameters())
        if param.device.type != "cuda":
            raise ValueError("CudaGraphRunner: the model is not on a CUDA device")
        if not sizes or min(sizes) < 1:
            raise ValueError(f"CudaGraphRunner: sizes={tuple(sizes)!r} must be positive batch sizes")
        self.model, self.cache = model, cache
        self.device = param.device
        self.page_size = cache.page_size
        self.sizes = tuple(sorted(set(sizes)))
        self.max_batch = self.sizes[-1]
        self.max_pages = max_pages_per_seq
        self.buffers = InputBuffers.allocate(self.max_batch, self.max_pages, self.device)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._logits: dict[int, torch.Tensor] = {}
        self._pool: torch.cuda._POOL_HANDLE | None = None
        self._row_pages: list[Sequence[int] | None] = [None] * self.max_batch  # what each table row holds
        self.num_replays = 0

    @property
    def captured(self) -> bool:
        return bool(self._graphs)

    def padded_size(self, num_rows: int) -> int | None:
        """The captured size a step of ``num_rows`` replays, or None when none fits."""
        return next((s for s in self.sizes if s >= num_rows), None)

    def can_run(self, num_rows: int, max_pages: int) -> bool:
        return self.captured and self.padded_size(num_rows) is not None and max_pages <= self.max_pages

    def _forward(self, size: int) -> torch.Tensor:
        hidden = self.model(self.buffers.batch(size), self.cache)
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size, largest first, sharing one memory pool. The buffers hold padding rows
        while capturing, so the warm-up runs write no KV and no state."""
        self._reset_padding(0)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):  # warm-up (Triton compiles, cuBLAS handles) off the capture
            for size in self.sizes:
                self._forward(size)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)
        for size in reversed(self.sizes):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                self._logits[size] = self._forward(size)
            if self._pool is None:
                self._pool = graph.pool()
            self._graphs[size] = graph
        torch.cuda.synchronize(self.device)

    def _reset_padding(self, start: int) -> None:
        b = self.buffers
        for t, value in ((b.slot_mapping, -1), (b.state_slots, -1), (b.seq_lens, 1), (b.input_ids, 0),
                         (b.positions, 0), (b.has_initial_state, False)):  # fmt: skip
            t[start:].fill_(value)

    @torch.inference_mode()
    def run(self, rows: Sequence[DecodeRow]) -> torch.Tensor:
        """Replay the graph for ``len(rows)`` (padded) and return the rows' fp32 logits [n, vocab]."""
        num_rows = len(rows)
        size = self.padded_size(num_rows)
        assert size is not None and self.captured, f"no captured graph for {num_rows} rows"
        page_size = self.page_size
        slots = [r.page_ids[r.position // page_size] * page_size + r.position % page_size for r in rows]
        host = torch.tensor(
            [[r.token for r in rows], [r.position for r in rows], [r.position + 1 for r in rows], slots,
             [r.state_slot for r in rows], [int(r.keep_state) for r in rows]],
            dtype=torch.int64,
        )  # fmt: skip
        b = self.buffers
        for i, r in enumerate(rows):  # page-table rows change only when a lane's request changes
            if self._row_pages[i] != r.page_ids:
                pages = torch.tensor(list(r.page_ids), dtype=torch.int32)
                b.page_table[i, : pages.numel()].copy_(pages, non_blocking=False)
                self._row_pages[i] = r.page_ids
        dev = host.to(self.device, non_blocking=False)
        b.input_ids[:num_rows].copy_(dev[0])
        b.positions[:num_rows].copy_(dev[1])
        b.seq_lens[:num_rows].copy_(dev[2])
        b.slot_mapping[:num_rows].copy_(dev[3])
        b.state_slots[:num_rows].copy_(dev[4])
        b.has_initial_state[:num_rows].copy_(dev[5].bool())
        if size > num_rows:
            self._reset_padding(num_rows)
        self._graphs[size].replay()
        self.num_replays += 1
        return self._logits[size][:num_rows]
