"""EngineCore: the synchronous engine step (schedule -> execute -> commit) and loading an artifact.

Owns: one `Scheduler`, one `ModelRunner`, the per-request stop-string detokenizers and the finish
counters. It is single-threaded: `AsyncEngine` (engine/serving.py) drives one from its loop thread,
`LLM` (engine/llm.py) and `ninfer` (engine/cli.py) drive one inline. Must not touch: HTTP, asyncio,
the model's tensors (the runner owns them).

Sampling parameters are resolved once, at `add_request` (engine.sampling.resolve_sampling): the model
family's preset for the thinking mode, then the server's flags, then the request's fields; the engine's
`greedy` flag forces temperature 0. The `Request` the scheduler holds carries the resolved values.

Stop strings are matched here, on incrementally detokenized text (across token edges), and end the
request through `Scheduler.stop_request` at the step boundary, so no token past the step that
completed the match is emitted. They cut only the answer: matching starts after the reasoning's
`</think>` (a request whose prompt opened `<think>`). (The HTTP API matches its stop strings itself,
off this thread: api/generation.py.)

Overlap scheduling (`EngineConfig.overlap`, `--overlap`; default on with CUDA): one step is

    plan N+1 = schedule()        the scheduler plans on what it has planned, not on what came back:
                                 a row after step N's sampled token feeds PREVIOUS_TOKEN (engine/step.py)
    launch(plan N+1)             queued on the device behind step N; sampled ids stay there
    commit(plan N, collect N)    step N's ids reach the host (non-blocking copy + event) while step N+1
                                 runs: stop checks, stop strings and the events happen here, off the
                                 device's critical path; detokenization and SSE framing on the API's side

so the device never waits for the host between steps. A request that ends at step N (a stop token, a stop
string, an abort) has had one more row planned in step N+1: that row's token is discarded, never emitted
(engine/scheduler/commit.py). A length limit wastes nothing (the scheduler knows it when planning).
The synchronous step (collect N, commit N, then plan N+1) is taken instead when:
  - step N's plan is not `overlappable` (engine/step.py `host_free`): a row samples with an output grammar,
    logprobs or a thinking budget (presence / frequency penalties overlap: their counts live on the device);
  - the pool is short of pages for the next rows (`Scheduler.can_plan_ahead`): preemption decides on
    committed state, and never takes a lane with a row in flight;
  - speculative decoding (`--spec`) is on: every step is synchronous (verify rows feed drafts the result brings).
Outputs are unchanged: greedy and per-request-seeded streams are identical with overlap on and off (a
wasted row draws from its own request's generator after that request ended). Unseeded sampling draws
from the shared generator, so its streams differ run to run anyway.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from engine.artifact.container import Artifact, read_artifact
from engine.cache.host import HostIndex
from engine.cache.kv import resolve_num_pages
from engine.config import EngineConfig
from engine.media.image import MediaError
from engine.media.prompt import PromptMedia
from engine.model.config import ModelConfig
from engine.model.forward import kv_spec
from engine.model.loader import load_model
from engine.model.qwen3_5 import Qwen3_5ForCausalLM
from engine.model.vision_load import VisionParts, load_vision
from engine.request import (
    Event,
    FinishEvent,
    FinishKind,
    FinishReason,
    ReasoningTokens,
    Request,
    SamplingParams,
    TokenEvent,
)
from engine.runner import ModelRunner, WarmupReport
from engine.runner.host_copies import host_budget, host_stat_fields
from engine.runner.pending import Launched
from engine.runner.sizing import measure_auto_pages
from engine.sampling import default_sampling, resolve_sampling
from engine.scheduler import Scheduler
from engine.spec.dflash_draft import DFlashKV, attach_dflash, dflash_of, load_dflash
from engine.spec.draft_head import attach, draft_head_of, load_draft_head, require_draft_head
from engine.structured.compiler import GrammarCompiler
from engine.tokenizer import IncrementalDetokenizer, Tokenizer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineStats:
    """Plain numbers for /stats and metrics (cumulative counters are since start)."""

    num_running: int
    num_waiting: int
    max_concurrency: int
    num_pages: int
    num_pages_used: int
    page_size: int
    kv_dtype: str
    prefill_chunk: int  # prefill tokens of a step without decode rows
    prefill_chunk_decoding: int  # ... of a step with decode rows (the effective value, default resolved)
    num_checkpoints: int
    # Admissions that reused a checkpoint, and the tokens reused instead of recomputed: a preempted lane's resume
    # counts too (the cached tokens a client is told, and ninfer_prefix_cache_hits_total, count requests' first
    # admission only, so under preemption these are larger)
    num_prefix_hits: int
    num_prefix_hit_tokens: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_steps: int  # scheduler steps (including empty ones)
    num_forward_steps: int  # steps that ran the model
    num_admission_scans: int
    num_loop_iterations: int  # passes of the serving loop (0 when driven inline)
    num_requests_added: int
    num_requests_finished: dict[str, int] = field(default_factory=dict)  # by finish kind
    # Pages on demand (engine/scheduler/ondemand.py): lanes preempted because the pool ran short, and the
    # tokens computed before a preemption that the resumes computed again (not restored from a checkpoint).
    num_preemptions: int = 0
    num_recomputed_tokens: int = 0
    # Of num_pages_used, the distinct pages prefix checkpoints hold (reclaimable unless a running request shares
    # them): with nothing running the two are equal, so free + cached pages is the whole pool (no page leaked).
    num_pages_cached: int = 0
    # ... of those, the pages only checkpoints hold: admission evicts them when it needs pages, so the pool's load
    # (the kv usage metric, as vLLM counts its cached free blocks) is num_pages_used - num_pages_reclaimable.
    num_pages_reclaimable: int = 0
    # Steps that computed prompt tokens, and of those the ones that also decoded other rows (a prefill beside
    # decoding lanes); a burst admitted together prefills in one step when its prompts fit the prefill budget and
    # carry no message boundary to checkpoint at (engine/serving.py, engine/scheduler/scheduler.py).
    num_prefill_steps: int = 0
    num_mixed_steps: int = 0
    burst_wait_ms: int = 0  # --burst-wait-ms (0: off)
    num_burst_holds: int = 0  # times the serving loop held an idle engine's first step for announced requests
    # ... of those, the holds that reached burst_wait_ms with announced requests still in preparation (they missed
    # the burst's prefill step: a slow upload, a long template, a starved process)
    num_burst_timeouts: int = 0
    num_announced: int = 0  # requests the API has announced and not yet submitted (or withdrawn)
    overlap: bool = False  # overlap scheduling is on (engine/core.py)
    num_requests_rejected: dict[str, int] = field(default_factory=dict)  # by reject code
    # Host KV parking (`--host-kv-cache-mib`; all zero when off; engine/runner/host_copies.py host_stat_fields).
    host_kv_capacity_bytes: int = 0
    host_kv_used_bytes: int = 0
    host_kv_allocated_bytes: int = 0
    host_kv_entries: int = 0
    host_kv_parks: int = 0
    host_kv_restores: int = 0
    host_kv_park_bytes: int = 0
    host_kv_restore_bytes: int = 0
    host_kv_park_seconds: float = 0.0
    host_kv_restore_seconds: float = 0.0
    host_kv_evictions: dict[str, int] = field(default_factory=dict)  # by reason (lru, replaced, ...)
    host_kv_park_refusals: dict[str, int] = field(default_factory=dict)  # by reason (oversize, pinned)
    # Evicted device checkpoints not parked, by reason: "covered" (its tokens stay on the device in longer
    # checkpoints), "on_host" (already parked); engine/scheduler/host.py says which are parked together.
    host_kv_park_skips: dict[str, int] = field(default_factory=dict)
    # Speculative decoding (`--spec`; all zero when off): verify rounds, drafts fed / accepted, decode rows
    # whose drafts were dropped near the length limit, rounds accepting each draft position.
    spec_method: str | None = None
    spec_draft_tokens: int = 0
    spec_rounds: int = 0
    spec_drafted_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_fallback_steps: int = 0
    spec_accepted_per_position: tuple[int, ...] = ()


@dataclass(frozen=True)
class LoadedArtifact:
    artifact: Artifact  # kept open: on the CPU the weights may be views of its memory map
    model: Qwen3_5ForCausalLM
    tokenizer: Tokenizer
    model_id: str
    vision: VisionParts | None = None  # --vision: the tower, media token ids, preprocessor config


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on the GPU; float32 on the CPU (bf16 matmuls there are slow and the tests compare in fp32)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def tokenizer_from_artifact(artifact: Artifact) -> Tokenizer:
    """The artifact's tokenizer and chat template: its resources at the top level or under ``frontend/`` (the
    published files' layout, which carries no ``config.json``: the geometry then comes from the weight profile
    its identity names, ``engine.model.loader.load_model``)."""
    return Tokenizer.from_resources(artifact.resource_names(), artifact.resource, artifact.path.name)


THINK_CLOSE = "\n</think>\n\n"  # how the chat template closes a reasoning before the answer


def reasoning_tokens(tokenizer: Tokenizer) -> ReasoningTokens | None:
    """The reasoning markers a thinking budget needs; None when the vocabulary has no `<think>` pair."""
    ids = tokenizer.special_ids
    if ids.think_start_id is None or ids.think_end_id is None:
        return None
    return ReasoningTokens(ids.think_start_id, ids.think_end_id, tuple(tokenizer.encode(THINK_CLOSE)))


def load_artifact(
    path: str | os.PathLike[str],
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    with_mtp: bool = False,
    lm_head_draft: bool = False,
    with_dflash: bool = False,
    with_vision: bool = False,
) -> LoadedArtifact:
    """Open `path`, load the text model and the tokenizer (and, with `lm_head_draft`, the reduced proposal
    head: engine/spec/draft_head.py; with `with_dflash` the DFlash companion the artifact carries, attached as
    ``model.dflash``: ValueError when it has none or the target cannot host it; with `with_vision`, the vision
    tower: ValueError when the artifact has none). (The embedded demo model is the entry points' default,
    engine/testing/demo.py: `LLM()`, `ninfer-serve`.)"""
    dev = torch.device(device) if device is not None else default_device()
    artifact = read_artifact(path)
    dtype = dtype if dtype is not None else default_dtype(dev)
    if lm_head_draft:  # refuse before any weight is read
        require_draft_head(artifact)
    draft = load_dflash(artifact, dev, dtype) if with_dflash else None  # refused before the model loads
    model = load_model(artifact, device=dev, dtype=dtype, with_mtp=with_mtp)
    if lm_head_draft:
        attach(model, load_draft_head(artifact, model))
    if draft is not None:
        attach_dflash(model, draft)
    vision = load_vision(artifact, dev, next(model.parameters()).dtype) if with_vision else None
    return LoadedArtifact(artifact, model, tokenizer_from_artifact(artifact), artifact.model_id, vision)


def apply_memory_limit(config: EngineConfig, device: torch.device) -> int | None:
    """Cap this process's device memory at ``config.gpu_memory_limit`` (torch's per-process memory fraction: an
    allocation past it raises out-of-memory as on a card of that size). Returns the cap in bytes (None: no
    cap, or not on CUDA). ValueError when what is already allocated (the weights) exceeds it."""
    limit = config.gpu_memory_limit_bytes
    if limit is None or device.type != "cuda":
        return None
    if device.index is None:  # torch's per-process fraction wants an index ("cuda" alone is refused)
        device = torch.device("cuda", torch.cuda.current_device())
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.empty_cache()  # cached blocks freed by loading are not the weights
    used = torch.cuda.memory_reserved(device)
    if used > limit:
        raise ValueError(
            f"gpu_memory_limit={config.gpu_memory_limit!r}: the weights already take {used / 1024**3:.2f} GiB"
        )
    torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), device)
    return limit


def check_pool_fits(config: EngineConfig, pool_bytes: int, device: torch.device) -> None:
    """ValueError (naming the cap) when the KV pool would not fit under ``--gpu-memory-limit``: refused at
    startup with the numbers rather than as an out-of-memory error from the allocator."""
    limit = config.gpu_memory_limit_bytes
    assert limit is not None
    room = limit - torch.cuda.memory_reserved(device)
    if pool_bytes > room:
        raise ValueError(
            f"gpu_memory_limit={config.gpu_memory_limit!r}: the KV pool needs {pool_bytes / 1024**3:.2f} GiB, "
            f"{room / 1024**3:.2f} GiB is left after the weights (lower --max-context / --kv-capacity, use "
            "--kv-dtype int8, or --kv-capacity auto)"
        )


def check_media(media: PromptMedia, vision: bool, max_media_tokens: int) -> None:
    """`MediaError` (its `code` names the API error) unless this engine can take `media`."""
    if not vision:
        raise MediaError("this server was started without --vision: images and video are refused",
                         code="vision_disabled")  # fmt: skip
    if media.num_media_tokens > max_media_tokens:
        raise MediaError(
            f"the request's media take {media.num_media_tokens} tokens, over this server's limit of "
            f"{max_media_tokens} (--max-media-tokens)",
            code="media_token_budget_exceeded",
        )


class EngineCore:
    """Use: `add_request` / `abort`, then `step()` while `has_work()`; each step returns its events."""

    def __init__(
        self,
        model: Qwen3_5ForCausalLM,
        tokenizer: Tokenizer,
        config: EngineConfig,
        *,
        seed: int | None = None,
        server_sampling: SamplingParams | None = None,
        vision: VisionParts | None = None,
    ) -> None:
        """`vision`: the loaded tower (`--vision`); None refuses requests with media."""
        self.config = config
        self.vision = vision
        if config.vision and vision is None:
            raise ValueError("vision=True: no vision tower was loaded (load_artifact(..., with_vision=True))")
        self.tokenizer = tokenizer
        self.model_config: ModelConfig = model.config
        if config.lm_head_draft and draft_head_of(model) is None:
            raise ValueError(
                "lm_head_draft=True: this model was loaded without a reduced output head (load the artifact with "
                "lm_head_draft=True; the artifact must carry text/draft_head)"
            )
        native = self.model_config.max_position_embeddings
        if config.scheduler.max_context > native:
            raise ValueError(
                f"max_context={config.scheduler.max_context}: must be <= {native:,}, this model's native context "
                "(max_position_embeddings): longer contexts need RoPE scaling, which this build does not do"
            )
        self.server_sampling = server_sampling
        param = next(model.parameters())
        # the pool's sizing counts every per-page cache the runner allocates: the MTP layers' KV under --spec mtp
        # (the runner's cache holds it) and the DFlash drafter's context KV under --spec dflash
        spec = kv_spec(self.model_config, param.dtype, config.cache.kv_dtype, with_mtp=config.spec == "mtp")
        if config.spec == "dflash":
            companion = DFlashKV.bytes_per_token(dflash_of(model).config, param.dtype)
            spec = dataclasses.replace(spec, companion_bytes_per_token=companion)
        limit = apply_memory_limit(config, param.device)
        budget = host_budget(config.cache)
        # Structured outputs: the API checks specs with it (400 before admission), the sampler enforces them.
        self.grammars = GrammarCompiler(tokenizer, model.config.vocab_size)

        def make_runner(num_pages: int) -> ModelRunner:
            return ModelRunner(
                model,
                num_pages=num_pages,
                page_size=config.cache.page_size,
                num_state_slots=Scheduler.num_state_slots(config.scheduler, config.cache),
                kv_dtype=config.cache.kv_dtype,
                seed=seed,
                cuda_graph=config.cuda_graph,
                max_context=config.scheduler.max_context,
                spec=config.spec,
                num_draft_tokens=config.num_draft_tokens,
                num_lanes=config.scheduler.max_concurrency,
                host_budget=budget,
                grammars=self.grammars,
                vision=vision.tower if vision is not None else None,
            )

        warm = config.warmup if config.warmup is not None else param.device.type == "cuda"
        # measured: engine/runner/sizing.py (under --gpu-memory-limit, within the cap)
        if config.cache.kv_capacity == "auto" and param.device.type == "cuda":
            num_pages = measure_auto_pages(
                make_runner,
                lambda probe: probe.warm_up(config.scheduler.prefill_chunk) if warm else None,
                min_pages=config.cache.num_pages(config.scheduler.max_context, auto_pages=0),
                page_bytes=spec.page_bytes(config.cache.page_size),
                device=param.device,
                memory_limit=limit,
            )
        else:
            num_pages = resolve_num_pages(config.cache, config.scheduler.max_context, spec)
        if limit is not None:
            check_pool_fits(config, num_pages * spec.page_bytes(config.cache.page_size), param.device)
        # None: on with CUDA (validated on the H200: tests/engine/test_overlap_gpu.py), off on the CPU, where a
        # launch computes at once and overlap would only add a step of latency
        overlap = config.overlap if config.overlap is not None else param.device.type == "cuda"
        self.overlap = overlap and config.spec is None  # speculative steps are synchronous
        if overlap and not self.overlap:
            logger.info("overlap scheduling is off under --spec %s (a speculative round ends in its own sync)",
                        config.spec)  # fmt: skip
        self.scheduler = Scheduler(
            config.scheduler,
            config.cache,
            num_pages=num_pages,
            eos_token_ids=tokenizer.eos_token_ids,
            num_draft_tokens=config.num_draft_tokens,
            reasoning_tokens=reasoning_tokens(tokenizer),
            overlap=self.overlap,
        )
        if config.spec is not None:
            self.scheduler.spec_stats.method = config.spec
        self._inflight: Launched | None = None  # overlap: the launched step not yet committed
        self.runner = make_runner(num_pages)
        self.warmup: WarmupReport | None = None
        if warm:  # before host parking attaches and before any request: its scratch pages are free after
            logger.info("warming up: running the first-use step shapes (kernel compilation, autotuning)")
            self.warmup = self.runner.warm_up(config.scheduler.prefill_chunk)
            logger.info("warm-up done: %d steps, %d tokens in %.1f s", self.warmup.steps, self.warmup.tokens,
                        self.warmup.seconds)  # fmt: skip
        # Host parking: the scheduler's index decides what to park and restore, the runner copies (None: off).
        self.host: HostIndex | None = None
        if budget is not None and self.runner.host_copies is not None:
            self.host = HostIndex(self.runner.host_copies.copier.geometry, budget)
            self.scheduler.attach_host(self.host)
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}
        self._stops_after_reasoning: set[str] = set()  # stop matching waits for `</think>`
        self.num_requests_added = 0
        self.finished: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()
        self.num_loop_iterations = 0  # maintained by the serving loop
        # ... as are its burst holds (engine/serving.py), and those that ran out with requests still announced
        self.num_burst_holds = 0
        self.num_burst_timeouts = 0

    # ---- requests -------------------------------------------------------------------------------

    def resolve(self, params: SamplingParams, *, thinking: bool = True) -> SamplingParams:
        preset = default_sampling(moe=self.model_config.is_moe, thinking=thinking)
        return resolve_sampling(params, preset=preset, server=self.server_sampling, greedy=self.config.greedy)

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        checkpoint_positions: Sequence[int] = (),
        *,
        thinking: bool = True,
        media: PromptMedia | None = None,
    ) -> FinishEvent | None:
        """Queue a request; returns its rejection event if it is refused at once, else None.

        Raises ValueError for malformed input (empty prompt, ids outside the vocabulary, a duplicate id), and
        `MediaError` for media this engine cannot take (no `--vision`, over `--max-media-tokens`).
        """
        if media is not None:
            check_media(media, self.vision is not None, self.config.max_media_tokens)
        vocab = self.model_config.vocab_size
        bad = [t for t in prompt_token_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt_token_ids: {bad[:5]} outside the vocabulary 0..{vocab - 1}")
        resolved = self.resolve(params, thinking=thinking)
        request = Request(
            request_id,
            list(prompt_token_ids),
            resolved,
            checkpoint_positions=tuple(checkpoint_positions),
            media=media,
        )
        rejection = self.scheduler.add_request(request)
        self.num_requests_added += 1
        if rejection is not None:
            self._count(rejection)
            return rejection
        if resolved.stop:
            self._detokenizers[request_id] = IncrementalDetokenizer(self.tokenizer, stop=resolved.stop)
            if request.in_reasoning:
                self._stops_after_reasoning.add(request_id)
        return None

    def abort(self, request_id: str, message: str = "") -> FinishEvent | None:
        """End a waiting or running request now (None if it is unknown or already finished)."""
        event = self.scheduler.abort(request_id, message)
        if event is not None:
            self._count(event)
        return event

    def abort_all(self, message: str) -> list[FinishEvent]:
        ids = list(self.scheduler.requests)
        return [e for e in (self.abort(i, message) for i in ids) if e is not None]

    # ---- one step -------------------------------------------------------------------------------

    def has_work(self) -> bool:
        return self._inflight is not None or self.scheduler.has_work()

    def can_batch_more(self) -> bool:
        """Idle (no lane holds a request, no step in flight) with requests waiting that leave a lane and prefill
        budget for more: what a burst hold (engine/serving.py) waits on. False when busy: a busy engine never
        waits, its next step must not be delayed for an arrival."""
        scheduler = self.scheduler
        if self._inflight is not None or scheduler.num_running or not scheduler.waiting:
            return False
        waiting_tokens = sum(r.num_tokens for r in scheduler.waiting)
        return (
            scheduler.num_waiting < self.config.scheduler.max_concurrency
            and waiting_tokens < self.config.scheduler.prefill_chunk
        )

    def step(self) -> list[Event]:
        if self.overlap:
            events = self._step_overlapped()
        else:
            plan = self.scheduler.schedule()
            events = self._match_stop_strings(self.scheduler.commit(plan, self.runner.execute(plan)))
        for event in events:
            if isinstance(event, FinishEvent):
                self._count(event)
        return events

    def _step_overlapped(self) -> list[Event]:
        """Plan and launch step N+1, then commit step N (see the module docstring)."""
        events: list[Event] = []
        inflight, self._inflight = self._inflight, None
        if inflight is not None and not self.scheduler.can_plan_ahead():
            events += self._commit(inflight)  # pages are short: decide on committed state
            inflight = None
        plan = self.scheduler.schedule()
        launched = self.runner.launch(plan)
        if inflight is not None:
            events += self._commit(inflight)
        if launched.in_flight and plan.overlappable:
            self._inflight = launched
        else:
            events += self._commit(launched)
        return events

    def _commit(self, launched: Launched) -> list[Event]:
        """Collect and commit one launched step; its stop strings end requests before the next commit."""
        return self._match_stop_strings(self.scheduler.commit(launched.plan, self.runner.collect(launched)))

    def _match_stop_strings(self, events: list[Event]) -> list[Event]:
        if not self._detokenizers:
            return events
        out: list[Event] = []
        finished = {e.request_id: i for i, e in enumerate(events) if isinstance(e, FinishEvent)}
        for event in events:
            if isinstance(event, FinishEvent):
                detok = self._detokenizers.get(event.request_id)
                limit = event.reason.kind in (FinishKind.LENGTH, FinishKind.CONTEXT)
                if detok is not None and detok.stop_matched is not None and limit:
                    # The last token both completed a stop string and reached the limit: a stop.
                    event = dataclasses.replace(event, reason=FinishReason.stop(detok.stop_matched))
                out.append(event)
                continue
            out.append(event)
            detok = self._detokenizers.get(event.request_id)
            if detok is None or not isinstance(event, TokenEvent) or detok.stop_matched is not None:
                continue
            detok.add_many(self._answer_tokens(event))
            if detok.stop_matched is not None and event.request_id not in finished:
                stop = self.scheduler.stop_request(event.request_id, detok.stop_matched)
                if stop is not None:
                    out.append(stop)
        return out

    def _answer_tokens(self, event: TokenEvent) -> Sequence[int]:
        """The event's tokens that belong to the answer (after the reasoning's `</think>`)."""
        if event.request_id not in self._stops_after_reasoning:
            return event.token_ids
        end = self.tokenizer.special_ids.think_end_id
        if end not in event.token_ids:
            return ()
        self._stops_after_reasoning.discard(event.request_id)
        return event.token_ids[event.token_ids.index(end) + 1 :]

    def _count(self, event: FinishEvent) -> None:
        self._detokenizers.pop(event.request_id, None)
        self._stops_after_reasoning.discard(event.request_id)
        self.runner.release([event.request_id])  # now, not at the next step (it may be a while)
        self.finished[event.reason.kind.value] += 1
        if event.reason.code is not None:
            self.rejected[event.reason.code.value] += 1

    # ---- introspection --------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """Monotonic time at which the oldest waiting request times out (None if none waits)."""
        waiting = self.scheduler.waiting
        if not waiting:
            return None
        return min(r.arrival_time for r in waiting) + self.config.scheduler.pending_timeout_ms / 1000.0

    def stats(self) -> EngineStats:
        s = self.scheduler.stats()
        planner = self.scheduler.host
        spec = self.scheduler.spec_stats
        return EngineStats(
            num_running=s.num_running,
            num_waiting=s.num_waiting,
            max_concurrency=self.config.scheduler.max_concurrency,
            num_pages=s.num_pages,
            num_pages_used=s.num_pages_used,
            page_size=self.config.cache.page_size,
            kv_dtype=self.config.cache.kv_dtype,
            prefill_chunk=self.config.scheduler.prefill_chunk,
            prefill_chunk_decoding=self.config.scheduler.effective_prefill_chunk_decoding,
            num_checkpoints=s.num_checkpoints,
            num_prefix_hits=s.num_prefix_hits,
            num_prefix_hit_tokens=s.num_prefix_hit_tokens,
            num_prefill_tokens=s.num_prefill_tokens,
            num_decode_tokens=s.num_decode_tokens,
            num_steps=s.num_steps,
            num_forward_steps=self.runner.num_steps,
            num_admission_scans=s.num_admission_scans,
            num_loop_iterations=self.num_loop_iterations,
            num_requests_added=self.num_requests_added,
            num_requests_finished=dict(self.finished),
            num_preemptions=s.num_preemptions,
            num_recomputed_tokens=s.num_recomputed_tokens,
            num_pages_cached=s.num_pages_cached,
            num_pages_reclaimable=s.num_pages_reclaimable,
            num_prefill_steps=s.num_prefill_steps,
            num_mixed_steps=s.num_mixed_steps,
            burst_wait_ms=self.config.burst_wait_ms,
            num_burst_holds=self.num_burst_holds,
            num_burst_timeouts=self.num_burst_timeouts,
            overlap=self.overlap,
            num_requests_rejected=dict(self.rejected),
            **host_stat_fields(self.host, self.runner.host_copies),
            host_kv_park_skips=dict(planner.park_skips) if planner is not None else {},
            spec_method=self.config.spec,
            spec_draft_tokens=spec.num_draft_tokens,
            spec_rounds=spec.rounds,
            spec_drafted_tokens=spec.drafted,
            spec_accepted_tokens=spec.accepted,
            spec_fallback_steps=spec.fallbacks,
            spec_accepted_per_position=tuple(spec.accepted_per_position),
        )

    def check_integrity(self) -> None:
        self.scheduler.check_integrity()
