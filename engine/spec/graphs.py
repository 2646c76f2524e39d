"""Static input buffers and CUDA graphs of the speculative step's target and MTP forwards (`--spec mtp`; the target
forwards of `--spec dflash` too, whose drafter has its own: engine/spec/dflash_graphs.py); the runner owns when to
use them.

A speculative step runs three kinds of forwards, each a fixed shape once its rows are padded:

- ``target`` (size, width): the target model over `size` rows of exactly `width` tokens (a verify group,
  width k + 1, GDN snapshots into ``snapshot_slots``; or width 1: plain decode rows of a speculative engine);
  returns the hidden states [size * width, H], and with `feature_layers` (DFlash) the target features of those
  layers [size * width, len(layers) * H] (`target_features`).
- ``catch_up`` (size): one MTP pass over `size` rows of up to ``K + 2`` (target hidden, next token) pairs
  each, packed back to back (a varlen batch; a padding row feeds one token); a sink sequence ``size`` takes
  the unused token rows, so every token row of the captured shape belongs to a sequence (no unwritten
  attention rows) and no row is stored (``slot_mapping = -1``); returns the MTP hidden states [(size + 1) *
  (K + 2), H].
- ``draft`` (size): one chained MTP step, one token per row, and its logits (the full head, or the reduced
  head of `--lm-head-draft`; the drafter samples outside).

Graphs are keyed ``(kind, size, width)``, captured for sizes 1..8 and widths 1..K+1 (DFlash: widths 1 and K + 1,
no MTP kinds) sharing one memory pool,
and replayed over the same `SpecInputs`; the eager path (the CPU, a graph that failed to capture, a step that
does not fit) runs the same function on the same buffers, so CPU tests exercise the fills and the padding.
Padding rows: ``state_slots = -1`` (the decode ops touch no state), ``slot_mapping = -1`` (no KV stored),
``snapshot_slots = -1`` (the verify positions read and write no state), ``seq_lens`` = the row's
width (it reads some earlier keys of its page-table row; the output is discarded).
Owns: the buffers, the graphs, their pool and outputs. Must not touch: requests, the scheduler, sampling.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from engine.model.forward import ForwardBatch, ModelCache
from engine.model.qwen3_5 import Qwen3_5ForCausalLM
from engine.spec.draft_head import proposal_logits
from engine.transfer import upload

logger = logging.getLogger(__name__)

SPEC_GRAPH_SIZES = (1, 2, 3, 4, 5, 6, 7, 8)
GraphKey = tuple[str, int, int]  # (kind, padded rows, width; 0 = varlen)
K = TypeVar("K")  # a graph key
Out = TypeVar("Out")  # a graph's static outputs


@dataclass(frozen=True, slots=True)
class StaticRow:
    """One row in plain ints: `tokens` at positions start .. start + len - 1 of a sequence in `page_ids`."""

    tokens: Sequence[int]
    start: int
    page_ids: Sequence[int]
    state_slot: int = -1  # -1: no GDN state (MTP forwards)
    keep_state: bool = True
    snapshots: Sequence[int] = ()  # a verify row's width - 1 snapshot slots


@dataclass
class SpecInputs:
    """Persistent device buffers of every speculative forward (module docstring: layout and padding)."""

    input_ids: torch.Tensor  # [(B + 1) * R]
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    hidden_in: torch.Tensor  # [(B + 1) * R, H] the MTP forwards' target hidden input
    query_start_loc: torch.Tensor  # [B + 2] int32
    seq_lens: torch.Tensor  # [B + 1] int32
    page_table: torch.Tensor  # [B + 1, P] int32
    state_slots: torch.Tensor  # [B + 1]
    has_initial_state: torch.Tensor  # [B + 1] bool
    snapshot_slots: torch.Tensor  # [B + 1, K]
    page_size: int
    row_tokens: int  # R = K + 2: the most tokens a row feeds (a catch-up row)

    @classmethod
    def allocate(cls, max_batch: int, num_draft_tokens: int, max_pages: int, page_size: int, hidden: int,
                 dtype: torch.dtype, device: torch.device) -> SpecInputs:  # fmt: skip
        r = num_draft_tokens + 2
        tokens = (max_batch + 1) * r

        def ints(n: int, value: int = 0, dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.full((n,), value, dtype=dtype, device=device)

        return cls(
            input_ids=ints(tokens), positions=ints(tokens), slot_mapping=ints(tokens, -1),
            hidden_in=torch.zeros(tokens, hidden, dtype=dtype, device=device),
            query_start_loc=ints(max_batch + 2, 0, torch.int32), seq_lens=ints(max_batch + 1, 1, torch.int32),
            page_table=torch.zeros(max_batch + 1, max_pages, dtype=torch.int32, device=device),
            state_slots=ints(max_batch + 1, -1), has_initial_state=ints(max_batch + 1, 0, torch.bool),
            snapshot_slots=torch.full((max_batch + 1, num_draft_tokens), -1, dtype=torch.int64, device=device),
            page_size=page_size, row_tokens=r,
        )  # fmt: skip

    @property
    def max_pages(self) -> int:
        return self.page_table.shape[1]

    def num_tokens(self, size: int, width: int) -> int:
        """Token rows of a forward of `size` rows: size * width, or (size + 1) * R for a varlen one."""
        return size * width if width else (size + 1) * self.row_tokens

    def batch(self, size: int, width: int) -> ForwardBatch:
        """Views of the buffers for a forward of `size` rows of `width` tokens (0: the varlen catch-up)."""
        t = self.num_tokens(size, width)
        b = size if width else size + 1
        verify = width > 1
        return ForwardBatch(
            input_ids=self.input_ids[:t], positions=self.positions[:t],
            query_start_loc=self.query_start_loc[: b + 1], seq_lens=self.seq_lens[:b],
            page_table=self.page_table[:b], slot_mapping=self.slot_mapping[:t],
            state_slots=self.state_slots[:b], has_initial_state=self.has_initial_state[:b],
            verify_width=width if verify else 0,
            snapshot_slots=self.snapshot_slots[:size, : width - 1] if verify else None,
        )  # fmt: skip

    def fill(self, rows: Sequence[StaticRow], size: int, width: int,
             row_pages: list[Sequence[int] | None]) -> None:  # fmt: skip
        """Write `rows` (each exactly `width` tokens; width 0: up to R, packed) and pad to `size` rows."""
        ps, t_cap = self.page_size, self.num_tokens(size, width)
        ids, pos, smap = [0] * t_cap, [0] * t_cap, [-1] * t_cap
        qsl, seq, states, cont = [], [], [], []
        k = self.snapshot_slots.shape[1]
        snaps = [-1] * (k * size)
        off = 0
        for i, r in enumerate(rows):
            n = len(r.tokens)
            assert (n == width) if width else (1 <= n <= self.row_tokens), f"row of {n} tokens, width {width}"
            qsl.append(off)
            for j, token in enumerate(r.tokens):
                p = r.start + j
                ids[off + j], pos[off + j], smap[off + j] = token, p, r.page_ids[p // ps] * ps + p % ps
            seq.append(r.start + n)
            states.append(r.state_slot)
            cont.append(int(r.keep_state))
            snaps[i * k : i * k + len(r.snapshots)] = r.snapshots
            off += n
        for _ in range(len(rows), size):  # padding rows: a full width each, or one token (varlen)
            n = width or 1
            qsl.append(off)
            seq.append(n)
            states.append(-1)
            cont.append(0)
            for j in range(n):
                pos[off + j] = j
            off += n
        if not width:  # the sink sequence: every remaining token row, stored nowhere
            qsl.append(off)
            seq.append(t_cap - off)
            states.append(-1)
            cont.append(0)
            for j in range(t_cap - off):
                pos[off + j] = j
        qsl.append(t_cap)
        for i, r in enumerate(rows):  # page-table rows change only when a row's pages change
            if row_pages[i] != r.page_ids:
                pages = upload(list(r.page_ids), self.page_table.device, torch.int32)
                self.page_table[i, : pages.numel()].copy_(pages)
                row_pages[i] = r.page_ids
        b = len(seq)
        # one pinned, non-blocking copy: a pageable one would wait for the stream (the previous replay) to drain
        dev = upload([*ids, *pos, *smap, *qsl, *seq, *states, *cont, *snaps], self.input_ids.device)
        parts = dev.split([t_cap, t_cap, t_cap, b + 1, b, b, b, k * size])
        self.input_ids[:t_cap].copy_(parts[0])
        self.positions[:t_cap].copy_(parts[1])
        self.slot_mapping[:t_cap].copy_(parts[2])
        self.query_start_loc[: b + 1].copy_(parts[3])
        self.seq_lens[:b].copy_(parts[4])
        self.state_slots[:b].copy_(parts[5])
        self.has_initial_state[:b].copy_(parts[6].bool())
        if k and size:
            self.snapshot_slots[:size].copy_(parts[7].view(size, k))


@dataclass(frozen=True, slots=True)
class DevicePatch:
    """Inputs known only on the device, written over a fill before the forward (no host wait): `token_index` /
    `token_values` set input ids (flat token rows); `positions` [n] moves the first n one-token rows (a draft step)
    to those positions: their slot mapping and sequence length follow from the filled page-table rows, and a
    position at or past its row's `capacity` (tokens its pages hold) stores nothing and reads its last page
    position instead (its output is discarded by the caller)."""

    token_index: torch.Tensor | None = None  # [m] int64
    token_values: torch.Tensor | None = None  # [m] int64
    positions: torch.Tensor | None = None  # [n] int64
    capacity: torch.Tensor | None = None  # [n] int64

    def apply(self, inputs: SpecInputs) -> None:
        if self.token_index is not None:
            assert self.token_values is not None
            inputs.input_ids.index_copy_(0, self.token_index, self.token_values)
        if self.positions is not None:
            assert self.capacity is not None
            n, ps = self.positions.shape[0], inputs.page_size
            pos = torch.minimum(self.positions, self.capacity - 1)
            page = inputs.page_table[:n].gather(1, (pos // ps)[:, None]).squeeze(1).long()
            slot = torch.where(self.positions < self.capacity, page * ps + pos % ps, -1)
            inputs.positions[:n].copy_(pos)
            inputs.slot_mapping[:n].copy_(slot)
            inputs.seq_lens[:n].copy_(pos + 1)


class SpecGraphs:
    """Use: `target`, `catch_up`, `draft` (each fills the buffers, then replays or runs eagerly); `capture()`
    once on CUDA. `fits(...)` says whether a forward can take this path (else the caller's eager one)."""

    def __init__(self, model: Qwen3_5ForCausalLM, cache: ModelCache, *, num_draft_tokens: int, max_pages: int,
                 sizes: Sequence[int] = SPEC_GRAPH_SIZES, feature_layers: tuple[int, ...] = (),
                 widths: Sequence[int] | None = None, with_mtp: bool = True) -> None:  # fmt: skip
        """feature_layers: the target forwards also return those layers' outputs (DFlash). widths: the target
        widths captured (default 1..K+1; a width between them runs the same function eagerly). with_mtp: capture
        the MTP kinds too (catch_up, draft)."""
        param = next(model.parameters())
        self.model, self.cache, self.k = model, cache, num_draft_tokens
        self.feature_layers, self.with_mtp = feature_layers, with_mtp
        self.widths = (
            tuple(sorted(set(widths))) if widths is not None else tuple(range(1, num_draft_tokens + 2))
        )
        self.device = param.device
        self.sizes = tuple(sorted(set(sizes)))
        self.max_batch = self.sizes[-1]
        self.inputs = SpecInputs.allocate(
            self.max_batch, num_draft_tokens, max_pages, cache.page_size, model.config.hidden_size,
            param.dtype, param.device,
        )  # fmt: skip
        self._row_pages: list[Sequence[int] | None] = [None] * (self.max_batch + 1)
        self._graphs: dict[GraphKey, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[GraphKey, tuple[torch.Tensor, ...]] = {}
        self.num_replays = 0
        self.runs: dict[str, int] = {"target": 0, "catch_up": 0, "draft": 0}  # forwards through the buffers
        self.report: dict[str, object] = {}  # what capture() captured (graphs per kind, seconds, MiB)

    @property
    def captured(self) -> bool:
        return bool(self._graphs)

    def padded_size(self, num_rows: int) -> int | None:
        return next((s for s in self.sizes if s >= num_rows), None)

    def fits(self, rows: Sequence[StaticRow], width: int) -> bool:
        """Rows of `width` tokens each (0: varlen, 1..R tokens each) fit a captured shape."""
        size = self.padded_size(len(rows))
        if size is None or not rows or any(len(r.page_ids) > self.inputs.max_pages for r in rows):
            return False
        cap = self.inputs.max_pages * self.inputs.page_size  # the sink reads up to (size + 1) * R keys
        if width == 0:
            return self.inputs.num_tokens(size, 0) <= cap and all(
                1 <= len(r.tokens) <= self.inputs.row_tokens for r in rows
            )
        return width <= self.k + 1 and width <= cap and all(len(r.tokens) == width for r in rows)

    # ---- the three forwards -----------------------------------------------------------------------

    def _target_fn(self, size: int, width: int) -> Callable[[], tuple[torch.Tensor, ...]]:
        if self.feature_layers:
            layers = self.feature_layers
            return lambda: self.model.forward_features(self.inputs.batch(size, width), self.cache, layers)
        return lambda: (self.model(self.inputs.batch(size, width), self.cache),)

    def _catch_up_fn(self, size: int) -> Callable[[], tuple[torch.Tensor, ...]]:
        t = self.inputs.num_tokens(size, 0)
        return lambda: (
            self.model.forward_mtp(self.inputs.batch(size, 0), self.inputs.hidden_in[:t], self.cache),
        )

    def _draft_fn(self, size: int) -> Callable[[], tuple[torch.Tensor, ...]]:
        def fn() -> tuple[torch.Tensor, ...]:
            hidden = self.model.forward_mtp(
                self.inputs.batch(size, 1), self.inputs.hidden_in[:size], self.cache
            )
            return hidden, proposal_logits(self.model, hidden)

        return fn

    def _fn(self, key: GraphKey) -> Callable[[], tuple[torch.Tensor, ...]]:
        kind, size, width = key
        if kind == "target":
            return self._target_fn(size, width)
        return self._catch_up_fn(size) if kind == "catch_up" else self._draft_fn(size)

    def _run(
        self,
        key: GraphKey,
        rows: Sequence[StaticRow],
        hidden: torch.Tensor | None,
        token_ids: torch.Tensor | None = None,
        patch: DevicePatch | None = None,
    ) -> tuple[torch.Tensor, ...]:
        kind, size, width = key
        self.inputs.fill(rows, size, width, self._row_pages)
        if token_ids is not None:  # the rows' tokens already on the device (they replace the filled ones)
            self.inputs.input_ids[: token_ids.shape[0]].copy_(token_ids)
        if patch is not None:
            patch.apply(self.inputs)
        if hidden is not None:
            self.inputs.hidden_in[: hidden.shape[0]].copy_(hidden)
        self.runs[kind] += 1
        graph = self._graphs.get(key)
        if graph is None:
            return self._fn(key)()
        graph.replay()
        self.num_replays += 1
        return self._outputs[key]

    def target(self, rows: Sequence[StaticRow], width: int) -> torch.Tensor:
        """Hidden states [len(rows) * width, H] of a uniform group (verify rows, or width-1 decode rows)."""
        size = self.padded_size(len(rows))
        assert size is not None
        return self._run(("target", size, width), rows, None)[0][: len(rows) * width]

    def target_features(self, rows: Sequence[StaticRow], width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden [len(rows) * width, H], target features [len(rows) * width, len(feature_layers) * H])."""
        assert self.feature_layers, "SpecGraphs built without feature_layers"
        size = self.padded_size(len(rows))
        assert size is not None
        out = self._run(("target", size, width), rows, None)
        return out[0][: len(rows) * width], out[1][: len(rows) * width]

    def catch_up(
        self, rows: Sequence[StaticRow], hidden: torch.Tensor, patch: DevicePatch | None = None
    ) -> torch.Tensor:
        """MTP hidden states [sum of rows' tokens, H] of a varlen catch-up (`hidden`: its target rows; `patch`:
        device values written over the filled inputs)."""
        size = self.padded_size(len(rows))
        assert size is not None
        return self._run(("catch_up", size, 0), rows, hidden, None, patch)[0][: hidden.shape[0]]

    def draft(
        self,
        rows: Sequence[StaticRow],
        hidden: torch.Tensor,
        token_ids: torch.Tensor | None = None,
        patch: DevicePatch | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One chained MTP step: (MTP hidden [n, H], logits [n, V] fp32) for one token per row (`token_ids`
        [n] on the device, when given, in place of the rows' host tokens; `patch`: device positions)."""
        size = self.padded_size(len(rows))
        assert size is not None
        out = self._run(("draft", size, 1), rows, hidden, token_ids, patch)
        return out[0][: len(rows)], out[1][: len(rows)]

    # ---- capture ------------------------------------------------------------------------------------

    def keys(self) -> list[GraphKey]:
        keys: list[GraphKey] = [("target", s, w) for s in self.sizes for w in self.widths]
        if self.with_mtp:
            keys += [("catch_up", s, 0) for s in self.sizes] + [("draft", s, 1) for s in self.sizes]
        return sorted(keys, key=lambda key: -self.inputs.num_tokens(key[1], key[2]))  # largest first

    @torch.inference_mode()
    def capture(self) -> bool:
        """Capture every key over padding-only buffers (no KV, no state written); False (eager, logged)
        when capture fails."""
        if self.device.type != "cuda":
            return False
        start, reserved = time.perf_counter(), torch.cuda.memory_reserved(self.device)
        try:
            self._capture()
        except RuntimeError as exc:  # e.g. an op that syncs with the host: run the static path eagerly
            logger.warning("speculative CUDA graph capture failed (%s); speculative steps run eagerly", exc)
            self._graphs.clear()
            self._outputs.clear()
            torch.cuda.synchronize(self.device)
            return False
        kinds = Counter(key[0] for key in self._graphs)
        self.report = {
            **kinds, "sizes": list(self.sizes), "target_widths": list(self.widths),
            "seconds": round(time.perf_counter() - start, 2),
            "reserved_mib": round((torch.cuda.memory_reserved(self.device) - reserved) / 2**20),
        }  # fmt: skip
        logger.info(
            "speculative CUDA graphs: %d captured (%s; sizes %s, target widths %s) in %.1f s, %.0f MiB reserved",
            len(self._graphs), ", ".join(f"{n} {kind}" for kind, n in kinds.items()), list(self.sizes),
            list(self.widths), time.perf_counter() - start,
            (torch.cuda.memory_reserved(self.device) - reserved) / 2**20,
        )  # fmt: skip
        return True

    def _capture(self) -> None:
        def prepare(key: GraphKey) -> None:
            self.inputs.fill((), key[1], key[2], self._row_pages)

        capture_keys(self.device, self.keys(), prepare, self._fn, self._graphs, self._outputs)


def capture_keys(
    device: torch.device,
    keys: Sequence[K],
    prepare: Callable[[K], None],
    fn: Callable[[K], Callable[[], Out]],
    graphs: dict[K, torch.cuda.CUDAGraph],
    outputs: dict[K, Out],
) -> None:
    """Warm every key's `fn(key)` up on a side stream (Triton compiles off the capture), then capture each, in the
    order given, into one shared pool; `prepare(key)` fills the static buffers (padding only) before each run."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for key in keys:
            prepare(key)
            fn(key)()
    torch.cuda.current_stream(device).wait_stream(stream)
    torch.cuda.synchronize(device)
    pool = None
    for key in keys:
        prepare(key)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            outputs[key] = fn(key)()
        pool = graph.pool() if pool is None else pool
        graphs[key] = graph
    torch.cuda.synchronize(device)
