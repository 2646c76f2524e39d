"""Static buffers and CUDA graphs of the DFlash drafter's round (`--spec dflash`; the runner owns when to use them).

One function per (size, bucket), run after a verify of `size` rows (padded) of up to W = K + 1 fed tokens each:

1. store: the context KV (`DFlashDraftModel.context_kv`) of every fed position s .. s + W - 1 of each row, from
   the verify's target features, into the drafter's paged context KV (engine/spec/dflash_draft.py `DFlashKV`);
2. block: per row the block [anchor, mask x K] at positions e .. e + K over its context KV [0, e) (a sliding
   layer [e - window + 1, e)), gathered through the row's page-table row at a fixed width (`bucket` keys for a
   full layer, min(bucket, window - 1) for a sliding one); keys past e are masked (`valid`);
3. out: the block's final hidden states at its K mask rows [size, K, H] (the target's head runs after the replay:
   one GEMM, the argmax of the one-wait round or the processed q of sampled rows, `DFlashDrafter.proposals`).

The frontier e and the anchor are device inputs (`ends`, `anchors`): the one-wait round computes them from the
acceptance (e = s + accepted + 1, anchor = the bonus) without a host wait (the general round uploads them); the
host only bounds e by s + W to pick the bucket, the smallest of `buckets` (powers of two from `MIN_BUCKET`, the
last one the page-table row's capacity) holding it. Positions fed but rejected store context KV past the frontier:
no block reads a key at or past its e, and the round that next feeds such a position stores it again first (the
target's KV does the same).

Padding (the module's one scheme, tests/engine/test_spec_dflash_graphs.py): a row's positions past its width and
every position of a padding row store into `DFlashKV.sink` (a slot of no page); a padding row has e = 0, so it
masks every context key (its own block keys keep the softmax finite) and its drafts are discarded.

Graphs are keyed (size, bucket): sizes 1..8 times the buckets up to `NINFER_DFLASH_GRAPH_CONTEXT` (engine/env.py;
the full layer's gathered context grows with the bucket, so the largest captured one bounds the pool), captured
largest first into one pool; a key without a graph (the CPU, a longer context, a failed capture) runs the same
function eagerly on the same buffers. Owns: the buffers, graphs, their pool and outputs. Must not touch: requests,
the scheduler, the target's cache (the drafter's context KV is its only write).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from engine.env import dflash_graph_context
from engine.spec.dflash_draft import DFlashDrafter, paged_slots
from engine.spec.graphs import SPEC_GRAPH_SIZES, capture_keys
from engine.transfer import upload

logger = logging.getLogger(__name__)

MIN_BUCKET = 256  # the smallest context bucket (keys gathered per row for a full layer)
DraftKey = tuple[int, int]  # (padded rows, context bucket)


@dataclass(frozen=True, slots=True)
class DraftRow:
    """One row of a drafter round: its verify fed positions start .. start + width - 1, in `page_ids`."""

    start: int
    page_ids: Sequence[int]


def context_buckets(capacity: int) -> tuple[int, ...]:
    """Powers of two from MIN_BUCKET below `capacity` (tokens a page-table row holds), then `capacity` itself."""
    out, bucket = [], MIN_BUCKET
    while bucket < capacity:
        out.append(bucket)
        bucket *= 2
    return (*out, capacity)


class DFlashGraphs:
    """Use: `draft(rows, features, ends, anchors, width)` after the verify (fills the buffers, then replays or runs
    eagerly); `capture()` once on CUDA; `fits(rows, width)` says whether a round can take this path."""

    def __init__(self, drafter: DFlashDrafter, *, num_draft_tokens: int, max_pages: int,
                 sizes: Sequence[int] = SPEC_GRAPH_SIZES, max_graph_context: int | None = None) -> None:  # fmt: skip
        """max_graph_context: the largest bucket captured (default `NINFER_DFLASH_GRAPH_CONTEXT`)."""
        self.drafter, self.model, self.draft_model = drafter, drafter.model, drafter.draft
        config = drafter.config
        self.k, self.width = num_draft_tokens, num_draft_tokens + 1
        assert 1 <= num_draft_tokens <= config.max_draft_tokens, num_draft_tokens
        self.page_size, self.device = drafter.page_size, drafter.device
        self.sizes = tuple(sorted(set(sizes)))
        self.buckets = context_buckets(max_pages * self.page_size)
        limit = dflash_graph_context() if max_graph_context is None else max_graph_context
        self.graph_buckets = tuple(b for b in self.buckets if b <= limit)
        b, w, dev = self.sizes[-1], self.width, self.device
        dtype = next(self.draft_model.parameters()).dtype
        self.features = torch.zeros(
            b * w, len(config.target_layer_ids) * config.hidden_size, dtype=dtype, device=dev
        )
        self.store_pos = torch.zeros(b * w, dtype=torch.int64, device=dev)
        self.store_slots = torch.full((b * w,), drafter.kv.sink, dtype=torch.int64, device=dev)
        self.page_table = torch.zeros(b, max_pages, dtype=torch.int64, device=dev)
        self.ends = torch.zeros(b, dtype=torch.int64, device=dev)
        self.anchors = torch.zeros(b, dtype=torch.int64, device=dev)
        self.masks = torch.full((b, self.k), config.mask_token_id, dtype=torch.int64, device=dev)
        self.offsets = torch.arange(max(self.buckets[-1], self.width), dtype=torch.int64, device=dev)
        self._row_pages: list[Sequence[int] | None] = [None] * b
        self._graphs: dict[DraftKey, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[DraftKey, torch.Tensor] = {}
        self.num_replays = 0
        self.runs = 0  # rounds through the buffers, graph or eager
        self.report: dict[str, object] = {}  # what capture() captured (graphs, buckets, seconds, MiB)

    @property
    def captured(self) -> bool:
        return bool(self._graphs)

    def key(self, rows: Sequence[DraftRow], width: int) -> DraftKey | None:
        """The (size, bucket) of a round over `rows` of `width` fed tokens, or None when it does not fit."""
        size = next((s for s in self.sizes if s >= len(rows)), None)
        if size is None or not rows or not 1 <= width <= self.width:
            return None
        if any(len(r.page_ids) > self.page_table.shape[1] for r in rows):
            return None
        end = max(r.start + width for r in rows)  # e <= start + width
        bucket = next((b for b in self.buckets if b >= end), None)
        return None if bucket is None else (size, bucket)

    def fits(self, rows: Sequence[DraftRow], width: int) -> bool:
        return self.key(rows, width) is not None

    def fill(self, rows: Sequence[DraftRow], size: int, width: int) -> None:
        """Store positions and slots of `rows` (width fed tokens each; padding: the sink), e = 0 and anchor 0 for
        every row up to `size` (the caller writes the real rows' device values over them), page-table rows."""
        ps, w, sink = self.page_size, self.width, self.drafter.kv.sink
        pos, slots = [0] * (size * w), [sink] * (size * w)
        for i, r in enumerate(rows):
            for j in range(width):
                p = r.start + j
                pos[i * w + j], slots[i * w + j] = p, r.page_ids[p // ps] * ps + p % ps
        for i, r in enumerate(rows):  # page-table rows change only when a row's pages change
            if self._row_pages[i] != r.page_ids:
                self.page_table[i, : len(r.page_ids)].copy_(upload(list(r.page_ids), self.device))
                self._row_pages[i] = r.page_ids
        dev = upload([*pos, *slots, *[0] * (2 * size)], self.device)  # one pinned, non-blocking copy
        parts = dev.split([size * w, size * w, size, size])
        self.store_pos[: size * w].copy_(parts[0])
        self.store_slots[: size * w].copy_(parts[1])
        self.ends[:size].copy_(parts[2])
        self.anchors[:size].copy_(parts[3])

    def draft(self, rows: Sequence[DraftRow], features: torch.Tensor, ends: torch.Tensor, anchors: torch.Tensor,
              width: int) -> torch.Tensor:  # fmt: skip
        """The blocks' final hidden states at their mask rows [n, K, H] (device) of n = len(rows) rows: `features`
        [n * width, F] the verify's target features, `ends` [n] each row's frontier e (<= start + width),
        `anchors` [n] the token at e (the bonus)."""
        key = self.key(rows, width)
        assert key is not None, "call fits() first"
        size, n = key[0], len(rows)
        self.fill(rows, size, width)
        self.features.view(self.sizes[-1], self.width, -1)[:n, :width].copy_(features.view(n, width, -1))
        self.ends[:n].copy_(ends)
        self.anchors[:n].copy_(anchors)
        self.runs += 1
        graph = self._graphs.get(key)
        if graph is None:
            return self._fn(key)()[:n]
        graph.replay()
        self.num_replays += 1
        return self._outputs[key][:n]

    def _fn(self, key: DraftKey) -> Callable[[], torch.Tensor]:
        size, bucket = key
        c, draft, kv, model = self.drafter.config, self.draft_model, self.drafter.kv, self.model
        stored = size * self.width

        def fn() -> torch.Tensor:
            # 1. store every fed position's context KV (padding positions: the sink)
            where = self.store_slots[:stored]
            layers_kv = draft.context_kv(self.features[:stored], self.store_pos[:stored])
            for layer, (key_, value) in enumerate(layers_kv):
                kv.keys[layer].index_copy_(0, where, key_)
                kv.values[layer].index_copy_(0, where, value)
            # 2. the block over each row's context [0, e) (sliding: the anchor's window), fixed widths
            ends, table = self.ends[:size, None], self.page_table[:size]
            contexts: dict[int | None, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
            for window in {c.window(i) for i in range(c.num_hidden_layers)}:
                width = bucket if window is None else max(1, min(bucket, window - 1))
                low = torch.zeros_like(ends) if window is None else (ends - window + 1).clamp(min=0)
                pos = low + self.offsets[:width]
                valid = pos < ends
                pos = torch.minimum(pos, (ends - 1).clamp(min=0))
                contexts[window] = (paged_slots(table, pos, self.page_size), pos, valid)

            def context(layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
                slots, pos, valid = contexts[c.window(layer)]
                return kv.keys[layer][slots], kv.values[layer][slots], pos, valid

            block = torch.cat([self.anchors[:size, None], self.masks[:size]], dim=1)  # [size, K + 1]
            positions = ends + self.offsets[: self.width]
            hidden = draft.forward_block(model.model.embed_tokens(block), positions, context)
            return hidden[:, 1:]  # 3. the mask rows

        return fn

    # ---- capture ------------------------------------------------------------------------------------

    def keys(self) -> list[DraftKey]:
        keys = [(s, b) for s in self.sizes for b in self.graph_buckets]
        return sorted(keys, key=lambda key: (-key[0] * key[1], -key[1]))  # largest first

    @torch.inference_mode()
    def capture(self) -> bool:
        """Capture every key over padding-only buffers (only the sink is written); False (eager, logged) when
        capture fails."""
        if self.device.type != "cuda":
            return False
        start, reserved = time.perf_counter(), torch.cuda.memory_reserved(self.device)
        try:
            self._capture()
        except RuntimeError as exc:
            logger.warning("DFlash drafter CUDA graph capture failed (%s); its rounds run eagerly", exc)
            self._graphs.clear()
            self._outputs.clear()
            torch.cuda.synchronize(self.device)
            return False
        self.report = {
            "drafter": len(self._graphs), "sizes": list(self.sizes), "context_buckets": list(self.graph_buckets),
            "seconds": round(time.perf_counter() - start, 2),
            "reserved_mib": round((torch.cuda.memory_reserved(self.device) - reserved) / 2**20),
        }  # fmt: skip
        logger.info(
            "DFlash drafter CUDA graphs: %d captured (sizes %s x context buckets %s; longer contexts eager) in "
            "%.1f s, %.0f MiB reserved", len(self._graphs), list(self.sizes), list(self.graph_buckets),
            time.perf_counter() - start, (torch.cuda.memory_reserved(self.device) - reserved) / 2**20,
        )  # fmt: skip
        return True

    def _capture(self) -> None:
        def prepare(key: DraftKey) -> None:
            self.fill((), key[0], self.width)

        capture_keys(self.device, self.keys(), prepare, self._fn, self._graphs, self._outputs)
