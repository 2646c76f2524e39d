"""ModelRunner: executes one `SchedulerOutput` on the model and returns the sampled token ids.

Owns: the device cache tensors (`ModelCache`: paged KV in the model dtype or int8, GDN state slots),
the `Sampler`, and per-request sampler state (seeded generators, output tokens for penalties), keyed
by request id and dropped when the scheduler lists the id in `released_request_ids`.
Must not touch: `Request` objects, page or slot allocation, the scheduler (STYLE 2.2 rule 1). It
receives plain step data and hands back a list of ints (one device-to-host copy per step).

One step, in the order `engine/scheduler/output.py` documents: page copies (copy-on-write of a reused
partial page), state restores (`copy_state_from`; `reset_state` becomes `has_initial_state=False`),
one flat varlen forward over every row, logits for the rows that `sample` only, sampling, then state
snapshots (`save_state_to`).

KV pool size (`--kv-capacity`): omitted = one `max_context` worth of pages; N tokens = ceil(N / page)
pages; `auto` = the largest page count that fits in free device memory after the weights with 1 GiB
of headroom on CUDA, and on the CPU a stated default of `CPU_AUTO_KV_BYTES` (256 MiB) of KV.
CUDA graphs (`engine/graphs.py`): on CUDA (bf16 or int8 KV: both decode paths are Triton kernels
without a host sync), a step whose rows are all single-token sampling rows (a decode step) replays a
graph captured per batch size 1..8 over static input buffers; every other step (prefill, mixed, the
CPU, `cuda_graph=False` / `--no-cuda-graph`) runs eagerly. Graphs are captured at construction
(`graphs_captured`); if capture fails, the runner logs why and decodes eagerly rather than not start.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.cache.host import HostParking
from engine.config import CacheConfig
from engine.graphs import DEFAULT_GRAPH_SIZES, CudaGraphRunner, DecodeRow
from engine.model.config import ModelConfig
from engine.model.forward import ForwardBatch, ModelCache, allocate_model_cache, make_forward_batch
from engine.model.qwen3_5 import Qwen3_5ForCausalLM
from engine.parking import HostCopies
from engine.request import SamplingParams
from engine.sampling import Sampler, output_token_counts
from engine.scheduler.output import HostRestoreReport, ScheduledRequest, SchedulerOutput
from engine.structured.compiler import GrammarCompiler
from kernels.attention import kv_int8_group_size

logger = logging.getLogger(__name__)

CPU_AUTO_KV_BYTES = 256 * 1024**2  # `--kv-capacity auto` on the CPU: this much KV
GPU_HEADROOM_BYTES = 1024**3  # `--kv-capacity auto` on CUDA: leave this much device memory free


def kv_bytes_per_page(config: ModelConfig, page_size: int, kv_dtype: str, dtype: torch.dtype) -> int:
    """Device bytes one KV page costs across every attention layer (K and V, plus int8 scales)."""
    values = page_size * config.num_key_value_heads * config.head_dim
    if kv_dtype == "int8":
        num_groups = config.head_dim // kv_int8_group_size(config.head_dim)
        per_kv = values + page_size * config.num_key_value_heads * num_groups * 2  # codes + fp16 scales
    else:
        per_kv = values * torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_attention_layers * per_kv


def auto_num_pages(bytes_per_page: int, device: torch.device) -> int:
    """Pages for `--kv-capacity auto`: free memory after the weights minus headroom (CPU: a default)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget = free - GPU_HEADROOM_BYTES
    else:
        budget = CPU_AUTO_KV_BYTES
    return max(0, budget // bytes_per_page)


def resolve_num_pages(
    cache_config: CacheConfig,
    max_context: int,
    model_config: ModelConfig,
    *,
    dtype: torch.dtype,
    device: torch.device,
) -> int:
    """The KV pool's page count for this config (fixed at startup)."""
    auto_pages = None
    if cache_config.kv_capacity == "auto":
        per_page = kv_bytes_per_page(model_config, cache_config.page_size, cache_config.kv_dtype, dtype)
        auto_pages = auto_num_pages(per_page, device)
    return cache_config.num_pages(max_context, auto_pages=auto_pages)


@dataclass(frozen=True)
class WarmupReport:
    """What `ModelRunner.warm_up` ran, and how long it took (compilation included)."""

    steps: int
    tokens: int
    seconds: float


class ModelRunner:
    """Use: `execute(scheduler_output) -> sampled ids`, once per step, in step order."""

    def __init__(
        self,
        model: Qwen3_5ForCausalLM,
        *,
        num_pages: int,
        page_size: int,
        num_state_slots: int,
        kv_dtype: str = "bf16",
        seed: int | None = None,
        cuda_graph: bool = True,
        max_context: int | None = None,
        graph_sizes: Sequence[int] = DEFAULT_GRAPH_SIZES,
        grammars: GrammarCompiler | None = None,
    ) -> None:
        """max_context bounds a request's page-table row (the graphs' page-table width); None = the
        whole pool. cuda_graph=False keeps every step eager. grammars: serves structured outputs."""
        if kv_dtype not in ("bf16", "int8"):
            raise ValueError(f"kv_dtype={kv_dtype!r}: must be 'bf16' or 'int8'")
        self.model = model
        self.config: ModelConfig = model.config
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.page_size = page_size
        self.kv_dtype = kv_dtype
        # NOTE: "bf16" KV means the model's compute dtype (bf16 on the GPU; float32 in CPU tests).
        self.cache: ModelCache = allocate_model_cache(
            self.config,
            num_pages,
            page_size,
            num_state_slots,
            dtype=self.dtype,
            device=self.device,
            kv_dtype="int8" if kv_dtype == "int8" else "model",
        )
        self.sampler = Sampler(self.device, seed, grammars)
        self.host: HostParking | None = None  # host KV parking, set by engine.parking when enabled
        self.host_copies: HostCopies | None = None  # its parks / unparks and restores in flight
        self._host_reports: tuple[HostRestoreReport, ...] = ()
        self._output_token_ids: dict[str, list[int]] = {}  # for presence / frequency penalties
        self.num_steps = 0
        self.num_graph_steps = 0
        self.graphs: CudaGraphRunner | None = None
        if cuda_graph and self.device.type == "cuda":
            max_pages = num_pages if max_context is None else min(num_pages, -(-max_context // page_size))
            self.graphs = CudaGraphRunner(model, self.cache, max_pages_per_seq=max_pages, sizes=graph_sizes)
            try:
                self.graphs.capture()
            except RuntimeError as exc:  # e.g. an op that syncs with the host: serve, eagerly, anyway
                logger.warning("CUDA graph capture failed (%s); every decode step runs eagerly", exc)
                self.graphs = None
                torch.cuda.synchronize(self.device)

    @property
    def graphs_captured(self) -> bool:
        return self.graphs is not None and self.graphs.captured

    @torch.inference_mode()
    def execute(self, output: SchedulerOutput) -> list[int]:
        """Run one step; one sampled token per row with `sample`, in row order."""
        self.release(output.released_request_ids)
        if self.host_copies is not None:  # parks, unparks: before anything writes the cache
            self.host_copies.run(self.cache, output)
        sampled = self._execute(output) if not output.is_empty else []
        if self.host_copies is not None:
            self._host_reports += self.host_copies.finish(idle=output.is_empty)
        return sampled

    @torch.inference_mode()
    def warm_up(self, prefill_chunk: int) -> WarmupReport:
        """Run the step shapes a server meets first, on scratch pages and state slots, before any request.

        First use of a shape costs far more than its steady state on the GPU (Triton compiles, fla-core
        autotunes, cuBLAS and cuDNN plan): measured at the 27B geometry, a cold server's first two steps took
        ~60 s and ~30 s. The steps: one prefill chunk of up to ``prefill_chunk`` tokens alone; a varlen batch
        continuing it beside a cold 3-token sequence (shorter than the conv window); a mixed decode + prefill
        step with a sampled (non-greedy) row; a decode step (a graph replay when graphs are captured).
        Nothing outlives the call: every request resets its state slot and writes a page before reading it,
        and the step counters are restored. Call it before the scheduler hands out pages.
        """
        started = time.perf_counter()
        page = self.page_size
        num_pages, num_slots = self.cache.num_pages, self.cache.num_state_slots
        # Sequence a: a first chunk + 39 tokens; b: 9 tokens in one page. Both must fit the pool.
        first = min(prefill_chunk, (num_pages - 1) * page - 39)
        if first < 1 or num_slots < 2:
            return WarmupReport(steps=0, tokens=0, seconds=0.0)
        a_pages = tuple(range(-(-(first + 39) // page)))
        b_pages = (a_pages[-1] + 1,)
        greedy, sampled = SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_p=0.9, seed=0)
        vocab = self.config.vocab_size
        tokens = torch.randint(0, vocab, (first + 39,), generator=torch.Generator().manual_seed(0)).tolist()

        def row(rid: str, ids: Sequence[int], start: int, pages: tuple[int, ...], slot: int,
                params: SamplingParams) -> ScheduledRequest:  # fmt: skip
            return ScheduledRequest(
                request_id=rid, lane=slot, token_ids=tuple(ids), start_pos=start, page_ids=pages, state_slot=slot,
                reset_state=start == 0, copy_state_from=None, save_state_to=None, sample=True,
                sampling_params=params, num_output_tokens=0,
            )  # fmt: skip

        a, b = "warmup-a", "warmup-b"
        plan = [
            [row(a, tokens[:first], 0, a_pages, 0, greedy)],
            [row(a, tokens[first : first + 37], first, a_pages, 0, greedy), row(b, tokens[:3], 0, b_pages, 1, greedy)],
            [row(a, tokens[first + 37 : first + 38], first + 37, a_pages, 0, greedy),
             row(b, tokens[3:8], 3, b_pages, 1, sampled)],
            [row(a, tokens[first + 38 : first + 39], first + 38, a_pages, 0, greedy),
             row(b, tokens[8:9], 8, b_pages, 1, sampled)],
        ]  # fmt: skip
        counters = (self.num_steps, self.num_graph_steps)
        for step_id, rows in enumerate(plan):
            self._execute(SchedulerOutput(step_id, tuple(rows), (), ()))
        self.release([a, b])
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.num_steps, self.num_graph_steps = counters
        return WarmupReport(
            steps=len(plan), tokens=sum(r.num_tokens for rows in plan for r in rows),
            seconds=time.perf_counter() - started,
        )  # fmt: skip

    def take_host_reports(self) -> tuple[HostRestoreReport, ...]:
        """Restores completed (or failed) since the last call; the engine loop hands them to `commit`."""
        reports, self._host_reports = self._host_reports, ()
        return reports

    def _execute(self, output: SchedulerOutput) -> list[int]:
        self.num_steps += 1
        rows = output.requests
        for src, dst in output.page_copies:
            self._copy_page(src, dst)
        for row in rows:
            if row.copy_state_from is not None:
                self._copy_state(row.copy_state_from, row.state_slot)
        if self._graph_eligible(rows):
            sampled = self._execute_graph(rows)
        else:
            sampled = self._execute_eager(rows)
        for row in rows:
            if row.save_state_to is not None:
                self._copy_state(row.state_slot, row.save_state_to)
        return sampled

    def _execute_eager(self, rows: Sequence[ScheduledRequest]) -> list[int]:
        batch = self._batch(rows)
        hidden = self.model(batch, self.cache)  # [T, hidden]
        sample_rows = [i for i, row in enumerate(rows) if row.sample]
        if not sample_rows:
            return []
        last = batch.last_token_indices()[torch.tensor(sample_rows, device=self.device)]
        logits = self.model.compute_logits(hidden, last)  # [num_sampled, vocab] fp32
        return self._sample(logits, [rows[i] for i in sample_rows])

    def _execute_graph(self, rows: Sequence[ScheduledRequest]) -> list[int]:
        assert self.graphs is not None
        logits = self.graphs.run([
            DecodeRow(row.token_ids[0], row.start_pos, row.page_ids, row.state_slot, not row.reset_state)
            for row in rows
        ])  # fmt: skip
        self.num_graph_steps += 1
        return self._sample(logits, rows)

    def _graph_eligible(self, rows: Sequence[ScheduledRequest]) -> bool:
        if self.graphs is None or not all(row.num_tokens == 1 and row.sample for row in rows):
            return False
        return self.graphs.can_run(len(rows), max(len(row.page_ids) for row in rows))

    def release(self, request_ids: Sequence[str]) -> None:
        """Drop the sampler state of requests that ended."""
        self.sampler.release(request_ids)
        for request_id in request_ids:
            self._output_token_ids.pop(request_id, None)

    def _batch(self, rows: Sequence[ScheduledRequest]) -> ForwardBatch:
        return make_forward_batch(
            [row.token_ids for row in rows],
            [row.start_pos for row in rows],
            [row.page_ids for row in rows],
            [row.state_slot for row in rows],
            page_size=self.page_size,
            has_initial_state=[not row.reset_state for row in rows],
            device=self.device,
        )

    def _sample(self, logits: torch.Tensor, rows: Sequence[ScheduledRequest]) -> list[int]:
        params: list[SamplingParams] = [row.sampling_params for row in rows]
        penalized = any(p.presence_penalty or p.frequency_penalty for p in params)
        constrained = self.sampler.constrains(params)
        if not penalized and not constrained and all(p.greedy for p in params):
            token_ids = logits.argmax(dim=-1).tolist()  # greedy fast path: the one host copy
        else:
            ids = [row.request_id for row in rows]
            counts = None
            if penalized:
                history = [self._output_token_ids.get(i, []) for i in ids]
                counts = output_token_counts(history, logits.shape[-1], self.device)
            token_ids = self.sampler.sample(logits, params, ids, counts).tolist()
            if constrained:
                self.sampler.commit(ids, token_ids)
        for row, token in zip(rows, token_ids, strict=True):
            self._output_token_ids.setdefault(row.request_id, []).append(token)
        return token_ids

    def _copy_page(self, src: int, dst: int) -> None:
        cache = self.cache
        tensors = [*cache.key_cache, *cache.value_cache, *(cache.key_scale or []), *(cache.value_scale or [])]
        for tensor in tensors:
            tensor[dst].copy_(tensor[src])

    def _copy_state(self, src: int, dst: int) -> None:
        for tensor in (*self.cache.conv_state, *self.cache.recurrent_state):
            tensor[dst].copy_(tensor[src])
