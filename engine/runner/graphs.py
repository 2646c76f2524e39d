"""CUDA-graph decode: one captured graph per (batch size, width), replayed over static input buffers.

A decode step (every row brings one token and samples) is the same ~1,300 kernels every time, so it is
captured once per batch size and replayed: no Python per layer, no launch overhead per kernel.
Graphs are keyed by ``(num_rows, width)``, width = tokens fed (and sampled) per row. Today only width 1
is captured (``CAPTURED_WIDTHS``); a verify step of k+1 tokens per row (speculative decoding) adds its
width here with its own buffers' layout.

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
``store_kv`` and decode attention are Triton kernels too), every row has one token and samples it, and
the batch fits a captured size and the page-table width. Anything else runs eagerly.
Owns: the captured graphs, their memory pool and logits, the static ``InputBuffers`` (engine/runner/inputs.py).
Must not touch: requests, the scheduler; the runner hands in plain ints (``DecodeRow``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.model.forward import ModelCache
from engine.model.qwen3_5 import Qwen3_5ForCausalLM
from engine.runner.inputs import DecodeRow, InputBuffers

DEFAULT_GRAPH_SIZES = (1, 2, 3, 4, 5, 6, 7, 8)
CAPTURED_WIDTHS = (1,)  # tokens per row of the captured steps (a decode step: 1)
GraphKey = tuple[int, int]  # (num_rows, width)


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
        self.widths = CAPTURED_WIDTHS
        self._graphs: dict[GraphKey, torch.cuda.CUDAGraph] = {}
        self._logits: dict[GraphKey, torch.Tensor] = {}
        self._pool: torch.cuda._POOL_HANDLE | None = None
        self._row_pages: list[Sequence[int] | None] = [None] * self.max_batch  # what each table row holds
        self.num_replays = 0

    @property
    def captured(self) -> bool:
        return bool(self._graphs)

    def padded_size(self, num_rows: int) -> int | None:
        """The captured size a step of ``num_rows`` replays, or None when none fits."""
        return next((s for s in self.sizes if s >= num_rows), None)

    def can_run(self, num_rows: int, max_pages: int, width: int = 1) -> bool:
        return (
            self.captured
            and width in self.widths
            and self.padded_size(num_rows) is not None
            and max_pages <= self.max_pages
        )

    def _forward(self, size: int) -> torch.Tensor:
        hidden = self.model(self.buffers.batch(size), self.cache)
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size, largest first, sharing one memory pool. The buffers hold padding rows
        while capturing, so the warm-up runs write no KV and no state."""
        self.buffers.reset_padding(0)
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
                self._logits[(size, 1)] = self._forward(size)
            if self._pool is None:
                self._pool = graph.pool()
            self._graphs[(size, 1)] = graph
        torch.cuda.synchronize(self.device)

    @torch.inference_mode()
    def run(self, rows: Sequence[DecodeRow], previous: torch.Tensor | None = None) -> torch.Tensor:
        """Replay the width-1 graph for ``len(rows)`` (padded) and return the rows' fp32 logits [n, vocab].
        ``previous``: the ids the previous step sampled, for rows with a ``previous_index`` (no host sync)."""
        num_rows = len(rows)
        size = self.padded_size(num_rows)
        assert size is not None and self.captured, f"no captured graph for {num_rows} rows"
        self.buffers.fill(rows, self.page_size, self._row_pages, previous)
        if size > num_rows:
            self.buffers.reset_padding(num_rows)
        self._graphs[(size, 1)].replay()
        self.num_replays += 1
        return self._logits[(size, 1)][:num_rows]
