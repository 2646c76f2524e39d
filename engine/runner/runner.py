"""ModelRunner: executes one `StepPlan` on the model and returns its `StepResult`.

Owns: the device cache tensors (`ModelCache`: paged KV in the model dtype or int8, GDN state slots),
the `Sampler`, and per-request sampler state (seeded generators, output tokens for penalties), keyed
by request id and dropped when the scheduler lists the id in `released_request_ids`.
Must not touch: `Request` objects, page or slot allocation, host-entry bookkeeping, the scheduler
(STYLE 2.2 rule 1; `.importlinter` forbids importing it). It receives plain step data
(engine/step.py) and hands back token lists (one device-to-host copy per step).

One step, in the order engine/step.py documents: host copies (engine/runner/host_copies.py), page
copies (copy-on-write of a reused partial page), state restores (`copy_state_from`; `reset_state`
becomes `has_initial_state=False`), one flat varlen forward over every row (engine/runner/inputs.py),
logits for the positions rows sample only, sampling (`_sample`, the one call into the `Sampler`), then
state snapshots (`save_state_to`).

KV pool size (`--kv-capacity`): omitted = one `max_context` worth of pages; N tokens = ceil(N / page)
pages; `auto` = the largest page count that fits in free device memory after the weights with 1 GiB
of headroom on CUDA, and on the CPU a stated default of `CPU_AUTO_KV_BYTES` (256 MiB) of KV.
CUDA graphs (engine/runner/graphs.py): on CUDA (bf16 or int8 KV: both decode paths are Triton kernels
without a host sync), a step whose rows are all single-token sampling rows (a decode step) replays a
graph captured per batch size 1..8 over static input buffers; every other step (prefill, mixed, the
CPU, `cuda_graph=False` / `--no-cuda-graph`) runs eagerly. Graphs are captured at construction
(`graphs_captured`); if capture fails, the runner logs why and decodes eagerly rather than not start.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from engine.cache.host import HostParking
from engine.config import CacheConfig
from engine.model.config import ModelConfig
from engine.model.forward import ModelCache, allocate_model_cache
from engine.model.qwen3_5 import Qwen3_5ForCausalLM
from engine.request import SamplingParams
from engine.runner.graphs import DEFAULT_GRAPH_SIZES, CudaGraphRunner
from engine.runner.host_copies import HostCopies
from engine.runner.inputs import DecodeRow, eager_batch, sample_indices
from engine.runner.speculative import SpecExecutor, num_spec_slots
from engine.runner.warmup import WarmupReport, warm_up
from engine.sampling import Sampler, output_token_counts
from engine.step import HostRestoreReport, RowPlan, StepPlan, StepResult
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


class ModelRunner:
    """Use: `execute(plan) -> StepResult`, once per step, in step order."""

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
        spec: str | None = None,
        num_draft_tokens: int = 0,
        num_lanes: int = 1,
    ) -> None:
        """max_context bounds a request's page-table row (the graphs' page-table width); None = the
        whole pool. cuda_graph=False keeps every step eager. spec="mtp": speculative decoding with
        `num_draft_tokens` MTP drafts per row (engine/runner/speculative.py; lanes 0..num_lanes-1)."""
        if kv_dtype not in ("bf16", "int8"):
            raise ValueError(f"kv_dtype={kv_dtype!r}: must be 'bf16' or 'int8'")
        self.model = model
        self.config: ModelConfig = model.config
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.page_size = page_size
        self.kv_dtype = kv_dtype
        # NOTE: "bf16" KV means the model's compute dtype (bf16 on the GPU; float32 in CPU tests).
        extra_slots = num_spec_slots(num_lanes, num_draft_tokens) if spec is not None else 0
        self.cache: ModelCache = allocate_model_cache(
            self.config,
            num_pages,
            page_size,
            num_state_slots + extra_slots,
            dtype=self.dtype,
            device=self.device,
            with_mtp=spec == "mtp",
            kv_dtype="int8" if kv_dtype == "int8" else "model",
        )
        self.sampler = Sampler(self.device, seed)
        self.spec: SpecExecutor | None = None
        if spec is not None:
            if spec != "mtp":
                raise ValueError(f"spec={spec!r}: this runner drafts with 'mtp' only")
            self.spec = SpecExecutor(
                model, self.cache, num_draft_tokens=num_draft_tokens, num_lanes=num_lanes,
                snapshot_base=num_state_slots, generator=self.sampler.generator,
            )  # fmt: skip
            cuda_graph = False  # TODO(#21): graphs for the verify widths and the draft steps
        self.host_copies: HostCopies | None = None  # host KV parking's copies (`attach_host`), None when off
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

    def attach_host(self, host: HostParking) -> None:
        """Execute the host parks and unparks of every later plan against `host` (its copies)."""
        assert self.host_copies is None, "attach_host twice"
        self.host_copies = HostCopies(host)

    def warm_up(self, prefill_chunk: int) -> WarmupReport:
        """The first-use step shapes, before any request (engine/runner/warmup.py)."""
        return warm_up(self, prefill_chunk)

    @property
    def graphs_captured(self) -> bool:
        return self.graphs is not None and self.graphs.captured

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> StepResult:
        """Run one step: per row, the tokens of its sampled positions, in row order."""
        self.release(plan.released_request_ids)
        if self.host_copies is not None:  # parks, unparks: before anything writes the cache
            self.host_copies.run(self.cache, plan)
        if self.spec is not None and not plan.is_empty:
            return self._execute_spec(plan)
        sampled = self.run_rows(plan) if not plan.is_empty else []
        if self.host_copies is not None:
            self._host_reports += self.host_copies.finish(idle=plan.is_empty)
        reports, self._host_reports = self._host_reports, ()
        return StepResult.of_sampled(plan, sampled, reports)

    def _execute_spec(self, plan: StepPlan) -> StepResult:
        """Steps 1-5 with speculative decoding (engine/runner/speculative.py): verify, roll back, draft."""
        assert self.spec is not None
        self.num_steps += 1
        for src, dst in plan.page_copies:
            self._copy_page(src, dst)
        for row in plan.rows:
            if row.copy_state_from is not None:
                self._copy_state(row.copy_state_from, row.state_slot)
        out = self.spec.run(plan.rows, self._output_token_ids)
        for row in plan.rows:
            if row.save_state_to is not None:
                self._copy_state(row.state_slot, row.save_state_to)
        if self.host_copies is not None:
            self._host_reports += self.host_copies.finish(idle=False)
        reports, self._host_reports = self._host_reports, ()
        return StepResult(
            out.tokens, out.num_accepted, out.num_rolled_back, reports, draft_token_ids=out.drafts
        )

    def run_rows(self, plan: StepPlan) -> list[list[int]]:
        """Steps 1-5 of a plan (no host copies): one token list per sampling row, in row order."""
        self.num_steps += 1
        rows = plan.rows
        for src, dst in plan.page_copies:
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

    def _execute_eager(self, rows: Sequence[RowPlan]) -> list[list[int]]:
        batch = eager_batch(rows, self.page_size, self.device)
        hidden = self.model(batch, self.cache)  # [T, hidden]
        indices = sample_indices(rows)
        if not indices:
            return []
        logits = self.model.compute_logits(
            hidden, torch.tensor(indices, device=self.device)
        )  # [S, vocab] fp32
        return self._sample(logits, [row for row in rows if row.sample])

    def _execute_graph(self, rows: Sequence[RowPlan]) -> list[list[int]]:
        assert self.graphs is not None
        logits = self.graphs.run([DecodeRow.of(row) for row in rows])
        self.num_graph_steps += 1
        return self._sample(logits, rows)

    def _graph_eligible(self, rows: Sequence[RowPlan]) -> bool:
        if self.graphs is None or not all(row.num_tokens == 1 and row.num_sample == 1 for row in rows):
            return False
        return self.graphs.can_run(len(rows), max(len(row.page_ids) for row in rows), width=1)

    def release(self, request_ids: Sequence[str]) -> None:
        """Drop the sampler state of requests that ended."""
        self.sampler.release(request_ids)
        if self.spec is not None:
            self.spec.release(request_ids)
        for request_id in request_ids:
            self._output_token_ids.pop(request_id, None)

    def _sample(self, logits: torch.Tensor, rows: Sequence[RowPlan]) -> list[list[int]]:
        """The one seam into the `Sampler`: `logits` [sum of rows' num_sample, vocab] fp32, rows in order,
        each row's positions in order. Returns each row's tokens (today's plans sample one per row)."""
        positions = [row for row in rows for _ in range(row.num_sample)]  # one entry per logits row
        params: list[SamplingParams] = [row.sampling_params for row in positions]
        penalized = any(p.presence_penalty or p.frequency_penalty for p in params)
        if not penalized and all(p.greedy for p in params):
            flat = logits.argmax(dim=-1).tolist()  # greedy fast path: the one host copy
        else:
            ids = [row.request_id for row in positions]
            counts = None
            if penalized:
                history = [self._output_token_ids.get(i, []) for i in ids]
                counts = output_token_counts(history, logits.shape[-1], self.device)
            flat = self.sampler.sample(logits, params, ids, counts).tolist()
        out: list[list[int]] = []
        it = iter(flat)
        for row in rows:
            tokens = [next(it) for _ in range(row.num_sample)]
            self._output_token_ids.setdefault(row.request_id, []).extend(tokens)
            out.append(tokens)
        return out

    def _copy_page(self, src: int, dst: int) -> None:
        cache = self.cache
        tensors = [*cache.key_cache, *cache.value_cache, *(cache.key_scale or []), *(cache.value_scale or [])]
        for tensor in tensors:
            tensor[dst].copy_(tensor[src])

    def _copy_state(self, src: int, dst: int) -> None:
        for tensor in (*self.cache.conv_state, *self.cache.recurrent_state):
            tensor[dst].copy_(tensor[src])
        if self.spec is not None:
            self.spec.copy_slot(src, dst)
