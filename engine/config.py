"""Engine, cache and scheduler configuration: frozen dataclasses validated on construction.

Owns: the user-facing knobs that map 1:1 to CLI flags / `LLM(**kwargs)` keywords
(`--max-context` -> `max_context`, `--kv-capacity` -> `kv_capacity`, `--no-prefix-reuse` ->
`prefix_reuse=False`, ...; the flag table is engine/flags.py), and EVERY rule on them: each field's range in
its dataclass's `__post_init__`, rules across groups in `EngineConfig.__post_init__`. A refusal is a
ValueError `"<field>=<value!r>: <rule>"`, the same words whether the value came from `ninfer-serve`, `ninfer`
or `LLM()`. Must not hold runtime-discovered values (the page count that `auto` resolves to, EOS ids): those
live in result objects built by the runner / tokenizer. `ModelConfig` lives in `engine/model/config.py`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

# The one kv_dtype vocabulary (`--kv-dtype`), checked here only: "bf16" = K/V in the model's compute dtype
# (bf16 on the GPU, float32 in CPU tests), "int8" = int8 codes plus fp16 group scales (engine/cache/kv.py).
KVDtype = Literal["bf16", "int8"]
KV_DTYPES: tuple[str, ...] = get_args(KVDtype)
SPEC_METHODS = (
    "mtp",
    "dflash",
)  # --spec: the MTP head, or the DFlash companion (35B-A3B artifacts carrying one)
MAX_DRAFT_TOKENS = {"mtp": 5, "dflash": 15}  # --draft-tokens range per method (upstream's)
DEFAULT_MAX_MEDIA_TOKENS = 16384  # --max-media-tokens: 16 images of 1024x1024 (1024 tokens each)
DEFAULT_DRAFT_TOKENS = 3  # --spec mtp without --draft-tokens (upstream's measured MTP3)
MAX_CONCURRENCY_LIMIT = 8  # startup-fixed lanes 1..8 (upstream kMaximumConcurrency)
# The served models' native context (max_position_embeddings of every registered Qwen3.5-family checkpoint).
# Longer would need RoPE scaling (YaRN), which this build does not do: positions past it were never trained.
NATIVE_CONTEXT = 262_144
# Prefill tokens of a step that also carries decode rows, when `prefill_chunk_decoding` is unset (capped at
# prefill_chunk). On the 27B a 2,048-token chunk still keeps the linears compute-bound, while a decoding lane
# waits for ~a quarter of an 8,192-token chunk (measured on the H200 at 100k context: 0.7-0.8 s per 8,192).
DEFAULT_PREFILL_CHUNK_DECODING = 2048
# --burst-wait-ms: how long an idle serving engine holds its first step for requests the API has announced
# (received, still being templated / tokenized), so that a burst shares one batched prefill (engine/serving.py).
DEFAULT_BURST_WAIT_MS = 20
MAX_BURST_WAIT_MS = 1000


_GROUP_FIELDS = ("artifact", "cache", "scheduler")  # EngineConfig fields that are not flags


def _require(ok: bool, name: str, value: object, rule: str) -> None:
    if not ok:
        raise ValueError(f"{name}={value!r}: {rule}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class CacheConfig:
    """Device KV pool and prefix-reuse knobs.

    `kv_capacity` is in tokens: None = one `max_context` worth of pages, an int N (>= max_context)
    = ceil(N / page_size) pages, "auto" = as many pages as fit after the weights (resolved by the
    KV cache owner from free memory and handed to `num_pages(..., auto_pages=...)`).
    """

    page_size: int = 64
    kv_dtype: KVDtype = "bf16"
    kv_capacity: int | Literal["auto"] | None = None
    prefix_reuse: bool = True
    # Checkpoint budget: GDN state snapshots kept for reuse (one state slot each, LRU-evicted).
    max_checkpoints: int = 16
    # Message-boundary checkpoints saved per request (the last ones of its prompt beyond the reuse).
    max_boundary_saves: int = 4
    # Host-RAM parking budget in MiB (`--host-kv-cache-mib`, 0 = off): evicted checkpoints are
    # parked there and restored by copy (engine/scheduler/host.py, engine/runner/host_copies.py).
    host_kv_cache_mib: int = 0

    def __post_init__(self) -> None:
        _require(_is_int(self.page_size) and self.page_size >= 1, "page_size", self.page_size, "must be >= 1")
        _require(self.kv_dtype in KV_DTYPES, "kv_dtype", self.kv_dtype, f"must be one of {KV_DTYPES}")
        cap = self.kv_capacity
        _require(
            cap is None or cap == "auto" or (_is_int(cap) and cap >= 1),
            "kv_capacity",
            cap,
            "must be 'auto', a positive token count, or None",
        )
        _require(isinstance(self.prefix_reuse, bool), "prefix_reuse", self.prefix_reuse, "must be a bool")
        _require(
            _is_int(self.max_checkpoints) and self.max_checkpoints >= 0,
            "max_checkpoints",
            self.max_checkpoints,
            "must be >= 0",
        )
        _require(
            _is_int(self.max_boundary_saves) and self.max_boundary_saves >= 0,
            "max_boundary_saves",
            self.max_boundary_saves,
            "must be >= 0",
        )
        mib = self.host_kv_cache_mib
        _require(_is_int(mib) and mib >= 0, "host_kv_cache_mib", mib, "must be >= 0 (0 = off)")
        _require(
            mib == 0 or self.prefix_reuse,
            "host_kv_cache_mib",
            mib,
            "needs prefix reuse (with --no-prefix-reuse nothing parked could ever be restored)",
        )

    def num_pages(self, max_context: int, *, auto_pages: int | None = None) -> int:
        """Pages in the device pool for this config (fixed at startup, never resized)."""
        min_pages = -(-max_context // self.page_size)
        if self.kv_capacity is None:
            return min_pages
        if self.kv_capacity == "auto":
            if auto_pages is None:
                raise ValueError("kv_capacity='auto': the caller must pass auto_pages (from free memory)")
            return max(min_pages, auto_pages)
        _require(
            self.kv_capacity >= max_context,
            "kv_capacity",
            self.kv_capacity,
            f"must be >= max_context ({max_context})",
        )
        return -(-self.kv_capacity // self.page_size)


@dataclass(frozen=True)
class SchedulerConfig:
    """Lanes, queueing and the per-step token budget."""

    max_context: int = 8192
    max_concurrency: int = 1
    max_pending_requests: int = 16
    pending_timeout_ms: int = 30_000
    prefill_chunk: int = 1024
    # Prefill budget of a step that also carries decode rows (bounds inter-token latency while another lane
    # prefills). None = min(prefill_chunk, DEFAULT_PREFILL_CHUNK_DECODING); see
    # `effective_prefill_chunk_decoding`. Never 0: a decoding lane must not starve a prefill.
    prefill_chunk_decoding: int | None = None
    # Output budget of a request that sets no max_tokens (still capped by max_context).
    default_max_tokens: int = 8192
    # prefill_chunk and prefill_chunk_decoding must be multiples of this (no flag): 128 for whoever configures
    # the engine (upstream NInfer's rule for --prefill-chunk); tests of chunking on the tiny models set 1.
    prefill_chunk_multiple: int = 128

    def __post_init__(self) -> None:
        _require(_is_int(self.max_context) and self.max_context >= 2, "max_context", self.max_context, ">= 2")
        _require(
            self.max_context <= NATIVE_CONTEXT,
            "max_context",
            self.max_context,
            f"must be <= {NATIVE_CONTEXT:,}, the models' native context: longer contexts need RoPE scaling, "
            "which this build does not do",
        )
        _require(
            _is_int(self.max_concurrency) and 1 <= self.max_concurrency <= MAX_CONCURRENCY_LIMIT,
            "max_concurrency",
            self.max_concurrency,
            f"must be in 1..{MAX_CONCURRENCY_LIMIT}",
        )
        _require(
            _is_int(self.max_pending_requests) and self.max_pending_requests >= 0,
            "max_pending_requests",
            self.max_pending_requests,
            "must be >= 0",
        )
        _require(
            _is_int(self.pending_timeout_ms) and self.pending_timeout_ms >= 1,
            "pending_timeout_ms",
            self.pending_timeout_ms,
            "must be >= 1",
        )
        multiple = self.prefill_chunk_multiple
        _require(_is_int(multiple) and multiple >= 1, "prefill_chunk_multiple", multiple, "must be >= 1")
        _require(
            _is_int(self.prefill_chunk) and self.prefill_chunk >= 1,
            "prefill_chunk",
            self.prefill_chunk,
            ">= 1",
        )
        _require(
            self.prefill_chunk % multiple == 0,
            "prefill_chunk",
            self.prefill_chunk,
            f"must be a multiple of {multiple}",
        )
        decoding = self.prefill_chunk_decoding
        _require(
            decoding is None or (_is_int(decoding) and decoding >= 1),
            "prefill_chunk_decoding",
            decoding,
            "must be an integer >= 1 (0 would starve a prefill while any lane decodes), or None for the default",
        )
        _require(
            decoding is None or decoding % multiple == 0,
            "prefill_chunk_decoding",
            decoding,
            f"must be a multiple of {multiple}",
        )
        _require(
            decoding is None or decoding <= self.prefill_chunk,
            "prefill_chunk_decoding",
            decoding,
            f"must be <= prefill_chunk ({self.prefill_chunk}): it only shrinks the budget while a lane decodes",
        )
        _require(
            _is_int(self.default_max_tokens) and self.default_max_tokens >= 1,
            "default_max_tokens",
            self.default_max_tokens,
            "must be >= 1",
        )

    @property
    def effective_prefill_chunk_decoding(self) -> int:
        """Prefill tokens of a step that also carries decode rows: the field, or its default when None."""
        if self.prefill_chunk_decoding is not None:
            return self.prefill_chunk_decoding
        return min(self.prefill_chunk, DEFAULT_PREFILL_CHUNK_DECODING)

    @property
    def max_num_batched_tokens(self) -> int:
        """The single token budget of one step: one prefill chunk plus one decode token per lane (an upper
        bound: a step with decode rows prefills at most `effective_prefill_chunk_decoding` <= prefill_chunk)."""
        return self.prefill_chunk + self.max_concurrency


@dataclass(frozen=True)
class EngineConfig:
    """Everything `LLM(artifact, **config)` / `ninfer-serve` configure, grouped by owner."""

    artifact: str | None = None
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    greedy: bool = False  # --greedy forces temperature 0 whatever the request says
    cuda_graph: bool = True  # --no-cuda-graph -> False: every decode step eager (engine/runner/graphs.py)
    # Run the first-use step shapes before serving (ModelRunner.warm_up): None = on a GPU only (where
    # kernels compile and autotune on first use), True = always, False (--no-warmup) = never.
    warmup: bool | None = None
    spec: str | None = None  # --spec: speculative decoding method (SPEC_METHODS)
    draft_tokens: int | None = (
        None  # --draft-tokens: drafts per round (None: DEFAULT_DRAFT_TOKENS with --spec)
    )
    # --lm-head-draft: MTP proposals from the artifact's reduced output head (engine/spec/draft_head.py)
    lm_head_draft: bool = False
    # --gpu-memory-limit GiB: cap the engine's device memory (weights, KV pool, activations) at this much, as if
    # the card had it (torch's per-process memory fraction; `--kv-capacity auto` sizes the pool within it).
    # None = the whole device. CUDA only (ignored on the CPU); the CUDA context itself is outside the cap.
    gpu_memory_limit: float | None = None
    # --vision: load the vision tower and accept images / video (engine/model/vision_load.py); without it the
    # tower's weights stay unread and media are refused (`vision_disabled`).
    vision: bool = False
    max_media_tokens: int = DEFAULT_MAX_MEDIA_TOKENS  # --max-media-tokens: placeholder tokens per request
    allow_remote_media: bool = False  # --allow-remote-media: fetch http(s) media URLs (api/media.py limits)

    # --overlap / --no-overlap: plan step N+1 while the device runs step N (engine/core.py says how and which
    # rows fall back to the synchronous step). None = on with CUDA, off on the CPU.
    overlap: bool | None = None
    # --burst-wait-ms: an idle serving engine with announced requests still in preparation (templating,
    # tokenizing) holds its first step up to this long, so simultaneous arrivals share one batched prefill
    # (engine/serving.py); a busy engine never waits. 0 = off. The serving loop only: `LLM` and `ninfer` add
    # their requests at once.
    burst_wait_ms: int = DEFAULT_BURST_WAIT_MS

    def __post_init__(self) -> None:
        _require(isinstance(self.greedy, bool), "greedy", self.greedy, "must be a bool")
        bw = self.burst_wait_ms
        _require(_is_int(bw) and 0 <= bw <= MAX_BURST_WAIT_MS, "burst_wait_ms", bw,
                 f"must be in 0..{MAX_BURST_WAIT_MS} (milliseconds; 0 turns the hold off)")  # fmt: skip
        _require(self.overlap in (None, True, False), "overlap", self.overlap, "must be None, True or False")
        _require(isinstance(self.vision, bool), "vision", self.vision, "must be a bool")
        _require(isinstance(self.allow_remote_media, bool), "allow_remote_media", self.allow_remote_media,
                 "must be a bool")  # fmt: skip
        mm = self.max_media_tokens
        _require(_is_int(mm) and mm >= 1, "max_media_tokens", mm, "must be >= 1")
        _require(
            not (self.vision and self.spec is not None),
            "spec",
            self.spec,
            "cannot run with --vision in this build (speculative rows do not splice media)",
        )
        limit = self.gpu_memory_limit
        _require(
            limit is None
            or (isinstance(limit, int | float) and not isinstance(limit, bool) and 0 < limit < 1e6),
            "gpu_memory_limit",
            limit,
            "must be a positive number of GiB, or None for the whole device",
        )
        _require(isinstance(self.cuda_graph, bool), "cuda_graph", self.cuda_graph, "must be a bool")
        _require(self.warmup in (None, True, False), "warmup", self.warmup, "must be None, True or False")
        # Rules across the groups.
        cap, max_context = self.cache.kv_capacity, self.scheduler.max_context
        _require(
            not isinstance(cap, int) or cap >= max_context,
            "kv_capacity",
            cap,
            f"must be >= max_context ({max_context})",
        )
        spec, host_mib = self.spec, self.cache.host_kv_cache_mib
        _require(spec is None or spec in SPEC_METHODS, "spec", spec, f"must be one of {SPEC_METHODS} or None")
        _require(
            not (spec == "dflash" and host_mib),
            "spec",
            spec,
            f"cannot run with host_kv_cache_mib={host_mib}: host parking does not capture DFlash draft "
            "caches, so a restored session would continue with a stale draft",
        )
        k = self.draft_tokens
        _require(k is None or spec is not None, "draft_tokens", k, "needs speculative decoding (--spec mtp)")
        if spec is not None:
            _require(
                k is None or (_is_int(k) and 1 <= k <= MAX_DRAFT_TOKENS[spec]),
                "draft_tokens",
                k,
                f"must be in 1..{MAX_DRAFT_TOKENS[spec]} with --spec {spec}",
            )

        _require(isinstance(self.lm_head_draft, bool), "lm_head_draft", self.lm_head_draft, "must be a bool")
        _require(
            not self.lm_head_draft or spec == "mtp",
            "lm_head_draft",
            self.lm_head_draft,
            "proposes MTP drafts: it needs --spec mtp",
        )

    @property
    def num_draft_tokens(self) -> int:
        """Drafts per speculative round (0 without --spec)."""
        if self.spec is None:
            return 0
        return self.draft_tokens if self.draft_tokens is not None else DEFAULT_DRAFT_TOKENS

    @property
    def gpu_memory_limit_bytes(self) -> int | None:
        """``gpu_memory_limit`` in bytes (GiB = 2^30), None when unset."""
        return None if self.gpu_memory_limit is None else int(self.gpu_memory_limit * 1024**3)

    @property
    def num_pages(self) -> int:
        """Pool size when kv_capacity is not 'auto' (auto is resolved by the KV cache owner)."""
        return self.cache.num_pages(self.scheduler.max_context)

    @classmethod
    def from_flags(cls, artifact: str | None = None, **flags: Any) -> EngineConfig:
        """Build from flat snake_case flag names (`max_context=..., prefix_reuse=False, ...`): the one way in
        for `ninfer-serve`, `ninfer` (both through engine/flags.py) and `LLM(**config)`. Every field of the
        three dataclasses is a keyword; an unknown keyword is refused."""
        groups: dict[str, dict[str, Any]] = {"cache": {}, "scheduler": {}, "engine": {}}
        owners = {
            **{f.name: "cache" for f in dataclasses.fields(CacheConfig)},
            **{f.name: "scheduler" for f in dataclasses.fields(SchedulerConfig)},
            **{f.name: "engine" for f in dataclasses.fields(cls) if f.name not in _GROUP_FIELDS},
        }
        for name, value in flags.items():
            if name not in owners:
                raise ValueError(f"{name}={value!r}: unknown engine option (known: {sorted(owners)})")
            groups[owners[name]][name] = value
        return cls(
            artifact=artifact,
            cache=CacheConfig(**groups["cache"]),
            scheduler=SchedulerConfig(**groups["scheduler"]),
            **groups["engine"],
        )
