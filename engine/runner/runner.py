"""ModelRunner: executes one `StepPlan` on the model and returns its `StepResult`.

Owns: the device cache tensors (`ModelCache`: paged KV in the model dtype or int8, GDN state slots),
the `Sampler`, and per-request sampler state (seeded generators, the host history of output tokens, the
device-resident penalty counts of engine/runner/penalties.py), keyed by request id and dropped when the
scheduler lists the id in `released_request_ids`.
Must not touch: `Request` objects, page or slot allocation, host-entry bookkeeping, the scheduler
(STYLE 2.2 rule 1; `.importlinter` forbids importing it). It receives plain step data
(engine/step.py) and hands back token lists (one device-to-host copy per step).

One step, in the order engine/step.py documents: host copies (engine/runner/host_copies.py), page
copies (copy-on-write of a reused partial page), state restores (`copy_state_from`; `reset_state`
becomes `has_initial_state=False`), one flat varlen forward over every row (engine/runner/inputs.py),
logits for the positions rows sample only, sampling (`_sample`, the one call into the `Sampler`), then
state snapshots (`save_state_to`).

Overlap scheduling (engine/runner/pending.py): `launch(plan)` queues a step and returns at once;
`collect(launched)` waits for its sampled ids and builds the `StepResult`; `execute` is the two back to
back. A plan whose sampling rows are all `host_free` (engine/step.py) samples on the device: its ids stay
there (`LastSampled`) to fill the next plan's `PREVIOUS_TOKEN` feeds, and reach the host through a
non-blocking copy and an event. Other plans (grammars, logprobs, thinking budgets, speculative verify)
sample through the host as before and finish inside `launch`.
Presence / frequency penalties read per-request counts kept on the device (`PenaltyCounts`): every sample
adds its ids there on the device, so a penalized row needs nothing from the host between steps. The host
history (`_output_token_ids`) stays complete in step order: a device-sampled row reserves its token's place at
`launch` and `collect` writes it. With `--spec` the penalties keep coming from the host history, as the
verifier's do (engine/runner/speculative.py). `timeline` records launches and
collects in order: with overlap, step N+1 is launched before step N is collected.

KV pool size (`--kv-capacity`, engine/cache/kv.py `resolve_num_pages`): omitted = one `max_context`
worth of pages; N tokens = ceil(N / page) pages; `auto` = the largest page count that fits in free
device memory after the weights with 1 GiB of headroom on CUDA, and on the CPU a stated default of
`CPU_AUTO_KV_BYTES` (256 MiB) of KV.
CUDA graphs (engine/runner/graphs.py): on CUDA (bf16 or int8 KV: both decode paths are Triton kernels
without a host sync), a step whose rows are all single-token sampling rows (a decode step) replays a
graph captured per batch size 1..8 over static input buffers; every other step (prefill, mixed, the
CPU, `cuda_graph=False` / `--no-cuda-graph`) runs eagerly. Graphs are captured at construction
(`graphs_captured`); if capture fails, the runner logs why and decodes eagerly rather than not start.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import replace

import torch

from engine.cache.host_blocks import HostBudget
from engine.cache.kv import KVDtype, ModelCache, allocate_cache
from engine.model.config import ModelConfig
from engine.model.forward import kv_spec
from engine.model.qwen3_5 import Qwen3_5ForCausalLM
from engine.model.vision import VisionTower
from engine.request import SamplingParams, TokenLogprob
from engine.runner.graphs import DEFAULT_GRAPH_SIZES, CudaGraphRunner
from engine.runner.host_copies import HostCopies
from engine.runner.inputs import DecodeRow, eager_batch, sample_indices
from engine.runner.media import MediaInputs, feeds_media, rope_delta
from engine.runner.penalties import PenaltyCounts
from engine.runner.pending import LastSampled, Launched, fill_previous, start_copy, upload
from engine.runner.speculative import SpecExecutor, num_spec_slots
from engine.runner.warmup import WarmupReport, warm_up
from engine.sampling import Sampler, output_token_counts, penalized, token_logprobs
from engine.step import PREVIOUS_TOKEN, HostRestoreReport, RowPlan, StepPlan, StepResult
from engine.structured.compiler import GrammarCompiler

logger = logging.getLogger(__name__)


class ModelRunner:
    """Use: `execute(plan) -> StepResult`, once per step, in step order."""

    def __init__(
        self,
        model: Qwen3_5ForCausalLM,
        *,
        num_pages: int,
        page_size: int,
        num_state_slots: int,
        kv_dtype: KVDtype = "bf16",
        seed: int | None = None,
        cuda_graph: bool = True,
        max_context: int | None = None,
        graph_sizes: Sequence[int] = DEFAULT_GRAPH_SIZES,
        host_budget: HostBudget | None = None,
        grammars: GrammarCompiler | None = None,
        spec: str | None = None,
        num_draft_tokens: int = 0,
        num_lanes: int = 1,
        vision: VisionTower | None = None,
    ) -> None:
        """max_context bounds a request's page-table row (the graphs' page-table width); None = the
        whole pool. cuda_graph=False keeps every step eager. kv_dtype: as `CacheConfig` validated it.
        host_budget: host KV parking's budget (`--host-kv-cache-mib`): the runner copies what the
        scheduler's plans park and restore (None: off). grammars: serves structured outputs.
        spec="mtp" | "dflash": speculative decoding with `num_draft_tokens` drafts per row from the MTP head or
        the DFlash companion (engine/runner/speculative.py; lanes 0..num_lanes-1). vision: the vision tower
        (`--vision`; engine/runner/media.py splices its rows at a prompt's media placeholders)."""
        self.model = model
        self.config: ModelConfig = model.config
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.page_size = page_size
        self.kv_dtype = kv_dtype
        # NOTE: "bf16" KV means the model's compute dtype (bf16 on the GPU; float32 in CPU tests).
        extra_slots = num_spec_slots(num_lanes, num_draft_tokens) if spec is not None else 0
        self.cache: ModelCache = allocate_cache(
            kv_spec(self.config, self.dtype, kv_dtype, with_mtp=spec == "mtp"),
            num_pages,
            page_size,
            num_state_slots + extra_slots,
            self.device,
        )
        self.sampler = Sampler(self.device, seed, grammars)
        self.media = MediaInputs(vision, self.device, self.dtype)
        self.spec: SpecExecutor | None = None
        self.spec_graphs_captured = False
        if spec is not None:
            if spec not in ("mtp", "dflash"):
                raise ValueError(f"spec={spec!r}: this runner drafts with 'mtp' or 'dflash'")
            self.spec = SpecExecutor(
                model, self.cache, num_draft_tokens=num_draft_tokens, num_lanes=num_lanes,
                snapshot_base=num_state_slots, generator=self.sampler.generator, method=spec,
            )  # fmt: skip
            max_pages = num_pages if max_context is None else min(num_pages, -(-max_context // page_size))
            # static buffers on every device (the CPU runs them eagerly); CUDA graphs of the verify widths,
            # the catch-up and the draft steps when graphs are on (engine/spec/graphs.py)
            self.spec_graphs_captured = self.spec.use_static_inputs(
                max_pages, capture=cuda_graph and self.device.type == "cuda"
            )
            cuda_graph = False  # the plain decode graphs: a speculative engine never runs a plain step
        self.host_copies = HostCopies(self.cache, host_budget) if host_budget is not None else None
        self._host_reports: tuple[HostRestoreReport, ...] = ()
        # the host history of output tokens (speculative penalties, forced tokens)
        self._output_token_ids: dict[str, list[int]] = {}
        # presence / frequency counts on the device (a speculative runner keeps today's host counts)
        self.penalties = PenaltyCounts(self.config.vocab_size, self.device) if self.spec is None else None
        self._logprobs: dict[str, tuple[TokenLogprob, ...]] = {}  # this step's, for rows that asked
        self.num_steps = 0
        self.num_graph_steps = 0
        self._last: LastSampled | None = None  # the latest launched step's device-sampled ids
        self._num_uncollected = 0
        self.num_overlapped_launches = 0  # launches while an earlier step was not yet collected
        self.timeline: deque[tuple[str, int]] = deque(maxlen=256)  # ("launch" | "collect", step_id), in order
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

    def warm_up(self, prefill_chunk: int) -> WarmupReport:
        """The first-use step shapes, before any request (engine/runner/warmup.py)."""
        return warm_up(self, prefill_chunk)

    @property
    def graphs_captured(self) -> bool:
        return (self.graphs is not None and self.graphs.captured) or self.spec_graphs_captured

    def execute(self, plan: StepPlan) -> StepResult:
        """Run one step synchronously: per row, the tokens of its sampled positions, in row order."""
        return self.collect(self.launch(plan))

    @torch.inference_mode()
    def launch(self, plan: StepPlan) -> Launched:
        """Queue one step on the device (host copies, forward, sampling) and return without waiting for it,
        unless it samples through the host. `collect` gives its result; steps are collected in launch order."""
        if self._num_uncollected:
            self.num_overlapped_launches += 1
        self._num_uncollected += 1
        self.timeline.append(("launch", plan.step_id))
        self.release(plan.released_request_ids)
        if self.host_copies is not None:  # parks, unparks: before anything writes the cache
            self.host_copies.run(self.cache, plan)
        launched = Launched(plan)
        if self.spec is not None and not plan.is_empty:
            self._last = None
            launched.result = self._execute_spec(plan)
            return launched
        host_sampled = self._launch_rows(plan, launched) if not plan.is_empty else []
        self._last = None
        if launched.sampled is not None:
            self._last = LastSampled.of(launched.sampled, plan.rows)
            launched.reserve_history(self._output_token_ids)
            start_copy(launched)
        elif host_sampled is not None:  # finished here: the result is built now
            launched.result = self._result(plan, host_sampled)
        return launched

    @torch.inference_mode()
    def collect(self, launched: Launched) -> StepResult:
        """The `StepResult` of a launched step (waits for its sampled ids to reach the host)."""
        assert self._num_uncollected > 0, "collect() without launch()"
        self._num_uncollected -= 1
        self.timeline.append(("collect", launched.plan.step_id))
        if launched.result is not None:
            return launched.result
        plan = launched.plan
        tokens = launched.tokens()
        launched.fill_history(tokens)
        flat = iter(tokens)
        return self._result(plan, [[next(flat)] for row in plan.rows if row.sample])

    def _result(self, plan: StepPlan, sampled: list[list[int]]) -> StepResult:
        if self.host_copies is not None:
            self._host_reports += self.host_copies.finish(idle=plan.is_empty)
        reports, self._host_reports = self._host_reports, ()
        result = StepResult.of_sampled(plan, sampled, reports)
        if self._logprobs:  # per row of the plan; rows that sampled nothing or asked for none get None
            rows = tuple(
                self._logprobs.pop(row.request_id, None) if row.sample else None for row in plan.rows
            )
            self._logprobs.clear()
            result = replace(result, logprobs=rows)
        return result

    def _execute_spec(self, plan: StepPlan) -> StepResult:
        """Steps 1-5 with speculative decoding (engine/runner/speculative.py): verify, roll back, draft."""
        assert self.spec is not None
        self.num_steps += 1
        for src, dst in plan.page_copies:
            self._copy_page(src, dst)
        for row in plan.rows:
            if row.copy_state_from is not None:
                self._copy_state(row.copy_state_from, row.state_slot)
        # a forced </think> fed as a row of its own (rows with drafts feed drafts, not committed output)
        self._take_forced_tokens([row for row in plan.rows if row.num_sample <= 1])
        out = self.spec.run(plan.rows, self._output_token_ids, self._sample)
        for row in plan.rows:
            if row.save_state_to is not None:
                self._copy_state(row.state_slot, row.save_state_to)
        if self.host_copies is not None:
            self._host_reports += self.host_copies.finish(idle=False)
        reports, self._host_reports = self._host_reports, ()
        logprobs = None
        if self._logprobs:  # rows that asked sampled one position through `_sample`
            logprobs = tuple(
                self._logprobs.pop(row.request_id, None) if row.sample else None for row in plan.rows
            )
            self._logprobs.clear()
        return StepResult(
            out.tokens, out.num_accepted, out.num_rolled_back, reports, logprobs, draft_token_ids=out.drafts
        )

    def run_rows(self, plan: StepPlan) -> list[list[int]]:
        """Steps 1-5 of a plan (no host copies), synchronously: one token list per sampling row, in row order."""
        launched = Launched(plan)
        sampled = self._launch_rows(plan, launched)
        if sampled is None:
            launched.reserve_history(self._output_token_ids)
            tokens = launched.sampled.tolist()  # type: ignore[union-attr]
            launched.fill_history(tokens)
            flat = iter(tokens)
            sampled = [[next(flat)] for row in plan.rows if row.sample]
        return sampled

    def _launch_rows(self, plan: StepPlan, launched: Launched) -> list[list[int]] | None:
        """Steps 1-5 of a non-empty plan. Returns the host-sampled token lists, or None when the plan's rows
        sampled on the device (`launched.sampled`, one id per sampling row)."""
        self.num_steps += 1
        rows = plan.rows
        for src, dst in plan.page_copies:
            self._copy_page(src, dst)
        for row in rows:
            if row.copy_state_from is not None:
                self._copy_state(row.copy_state_from, row.state_slot)
        logits = self._execute_graph(rows) if self._graph_eligible(rows) else self._execute_eager(rows)
        sampling = [row for row in rows if row.sample]
        sampled: list[list[int]] | None = []
        if logits is not None and plan.overlappable and self._counts_on_device(sampling):
            launched.sampled = self._sample_on_device(logits, sampling)
            sampled = None
        elif logits is not None:
            sampled = self._sample(logits, sampling)
        for row in rows:
            if row.save_state_to is not None:
                self._copy_state(row.state_slot, row.save_state_to)
        return sampled

    def _execute_eager(self, rows: Sequence[RowPlan]) -> torch.Tensor | None:
        """The logits of the rows' sampled positions [S, vocab] fp32 (None when no row samples)."""
        batch = self.media.apply(eager_batch(rows, self.page_size, self.device), rows)
        fill_previous(batch.input_ids, rows, self._last)
        hidden = self.model(batch, self.cache)  # [T, hidden]
        indices = sample_indices(rows)
        if not indices:
            return None
        return self.model.compute_logits(hidden, upload(indices, self.device))  # [S, vocab] fp32

    def _execute_graph(self, rows: Sequence[RowPlan]) -> torch.Tensor:
        assert self.graphs is not None
        last = self._last
        decode = [
            replace(
                DecodeRow.of(row, last.index[row.request_id] if row.token_ids[0] == PREVIOUS_TOKEN else -1),  # type: ignore[union-attr]
                rope_delta=rope_delta(row),
            )
            for row in rows
        ]
        logits = self.graphs.run(decode, last.ids if last is not None else None)
        self.num_graph_steps += 1
        return logits

    def _sample_on_device(self, logits: torch.Tensor, rows: Sequence[RowPlan]) -> torch.Tensor:
        """Sample `host_free` rows (one position each) without reading anything back: ids [S] int64. Penalized
        rows read their counts on the device and add the ids sampled to them there."""
        params = [row.sampling_params for row in rows]
        if not penalized(params) and all(p.greedy for p in params):
            return logits.argmax(dim=-1)
        ids = [row.request_id for row in rows]
        counts, keys = self._device_counts(ids, params)
        sampled = self.sampler.sample(logits, params, ids, counts)
        self._count_sampled(keys, sampled)
        return sampled

    def _counts_on_device(self, rows: Sequence[RowPlan]) -> bool:
        """Whether the rows' penalty counts (if any) are on the device: a speculative runner keeps them in the
        host history, so its penalized plain steps (warm-up, the context limit's fallback) sample on the host."""
        return self.penalties is not None or not penalized([row.sampling_params for row in rows])

    def _device_counts(
        self, request_ids: Sequence[str], params: Sequence[SamplingParams]
    ) -> tuple[torch.Tensor | None, list[str | None]]:
        """Penalty counts [B, vocab] of each position from the device (None when no position is penalized), and
        the positions' count keys (the request id of a penalized position, else None) for `_count_sampled`."""
        assert self.penalties is not None
        keys = [rid if penalized([p]) else None for rid, p in zip(request_ids, params, strict=True)]
        if not any(k is not None for k in keys):
            return None, keys
        return self.penalties.gather(keys), keys

    def _count_sampled(self, keys: Sequence[str | None], sampled: torch.Tensor) -> None:
        """Add the ids sampled ([B] on the device) to the penalized positions' device counts."""
        if self.penalties is not None:
            self.penalties.add(keys, sampled)  # a no-op when no key is set

    def _graph_eligible(self, rows: Sequence[RowPlan]) -> bool:
        if self.graphs is None or not all(row.num_tokens == 1 and row.num_sample == 1 for row in rows):
            return False
        if any(feeds_media(row) for row in rows):
            return False
        return self.graphs.can_run(len(rows), max(len(row.page_ids) for row in rows), width=1)

    def release(self, request_ids: Sequence[str]) -> None:
        """Drop the sampler state of requests that ended."""
        self.sampler.release(request_ids)
        self.media.release(request_ids)
        if self.spec is not None:
            self.spec.release(request_ids)
        for request_id in request_ids:
            self._output_token_ids.pop(request_id, None)
        if self.penalties is not None:
            self.penalties.release(request_ids)

    def _sample(self, logits: torch.Tensor, rows: Sequence[RowPlan]) -> list[list[int]]:
        """The one seam into the `Sampler`: `logits` [sum of rows' num_sample, vocab] fp32, rows in order,
        each row's positions in order. Returns each row's tokens (today's plans sample one per row)."""
        self._take_forced_tokens(rows)
        positions = [row for row in rows for _ in range(row.num_sample)]  # one entry per logits row
        params: list[SamplingParams] = [row.sampling_params for row in positions]
        any_penalty = penalized(params)
        constrained = self.sampler.constrains(params)
        if constrained:  # a grammar's mask for a later position depends on the earlier sampled tokens
            assert all(row.num_sample == 1 for row in rows if row.sampling_params.structured), (
                "one token per row"
            )
        if not any_penalty and not constrained and all(p.greedy for p in params):
            flat = logits.argmax(dim=-1).tolist()  # greedy fast path: the one host copy
        else:
            ids = [row.request_id for row in positions]
            counts: torch.Tensor | None = None
            keys: list[str | None] = []
            if self.spec is not None and any_penalty:  # speculative: the counts of the host history
                history = [self._output_token_ids.get(i, []) for i in ids]
                counts = output_token_counts(history, logits.shape[-1], self.device)
            elif any_penalty:
                counts, keys = self._device_counts(ids, params)
            sampled = self.sampler.sample(logits, params, ids, counts)
            self._count_sampled(keys, sampled)
            flat = sampled.tolist()
            if constrained:
                self.sampler.commit(ids, flat)
        if any(p.logprobs is not None for p in params):
            found = token_logprobs(logits, flat, [p.logprobs for p in params])
            for row, lp in zip(positions, found, strict=True):
                if lp is not None:
                    self._logprobs[row.request_id] = (*self._logprobs.get(row.request_id, ()), lp)
        out: list[list[int]] = []
        it = iter(flat)
        for row in rows:
            tokens = [next(it) for _ in range(row.num_sample)]
            self._output_token_ids.setdefault(row.request_id, []).extend(tokens)
            out.append(tokens)
        return out

    def _take_forced_tokens(self, rows: Sequence[RowPlan]) -> None:
        """Output tokens the scheduler committed that this runner did not sample: the thinking budget's forced
        `</think>` replaces the last sampled token with the template's close (fed this step as a short row). The
        penalty history and the grammar matcher must see the committed tokens, not the replaced one (a
        grammar starts after `</think>`). A sampling row feeds up to the end of the known tokens, so its last
        min(fed, num_output_tokens) fed tokens are output tokens; when they disagree with what this runner
        sampled, its last sampled token was replaced by them. (The replaced token reached the matcher while
        it was still inside the reasoning, where only `</think>` changes its state.)"""
        for row in rows:
            history = self._output_token_ids.get(row.request_id)
            n = min(row.num_tokens, row.num_output_tokens)
            if not row.sample or not history or n == 0 or PREVIOUS_TOKEN in row.token_ids:
                continue
            fed = list(row.token_ids[-n:])
            if history[-n:] == fed:
                continue
            if self.penalties is not None:  # the device counts follow: minus the replaced token, plus the fed
                self.penalties.adjust(row.request_id, history[-1:], fed)
            history[-1:] = fed
            if row.sampling_params.structured is not None:
                self.sampler.commit([row.request_id] * len(fed), fed)

    def _copy_page(self, src: int, dst: int) -> None:
        cache = self.cache
        tensors = [*cache.key_cache, *cache.value_cache, *(cache.key_scale or []), *(cache.value_scale or [])]
        for tensor in tensors:
            tensor[dst].copy_(tensor[src])
        if self.spec is not None:
            self.spec.copy_page(src, dst)

    def _copy_state(self, src: int, dst: int) -> None:
        self.cache.copy_state_slot(src, dst)
        if self.spec is not None:
            self.spec.copy_slot(src, dst)
