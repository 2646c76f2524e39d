"""The command-line flags that configure the engine, for `ninfer` (engine/cli.py) and `ninfer-serve`
(api/serve.py): one table, one row per flag, each naming the `EngineConfig.from_flags` keyword it sets.

The mapping is 1:1: the keyword is the flag's name in snake_case (`--max-context` -> `max_context`), and a
`--no-X` switch sets `X=False`. Parsing here only turns text into a value (an integer where the text is
one, else the text as given); every range and every cross-flag rule lives in engine/config.py, so both
programs and `LLM(**keywords)` accept and refuse exactly the same values with the same words. Defaults are
the config's own (a flag not given passes nothing).

A new engine flag is a field (and its rule) in engine/config.py plus one row in `ENGINE_FLAGS` below.
Sections: "engine" rows are offered by both programs, "server" rows (lanes, queueing, host parking) only by
`ninfer-serve`, "sampling" rows sit with the sampling defaults (`add_sampling_flags`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from engine.config import DEFAULT_DRAFT_TOKENS, KV_DTYPES, SPEC_METHODS, EngineConfig
from engine.request import SamplingParams
from engine.sampling import EFFORT_THINKING_BUDGETS, REASONING_EFFORTS, effort_thinking

TOP_K_DEFAULT_LIMIT = 20  # --top-k as a server / CLI default: 0..20 (upstream NInfer's range)


class _Adder(Protocol):  # an ArgumentParser or one of its argument groups
    def add_argument(self, *names: str, **kwargs: Any) -> Any: ...


def int_or_text(text: str) -> int | str:
    """An integer where `text` is one; else the text, for the config to refuse naming the field."""
    try:
        return int(text)
    except ValueError:
        return text


def float_or_text(text: str) -> float | str:
    """A number where `text` is one; else the text, for the config to refuse naming the field."""
    try:
        return float(text)
    except ValueError:
        return text


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"{value} must be >= {low}")
    return value


def positive_int(text: str) -> int:
    """argparse type for the programs' own (non-engine) counts: ports, sizes, intervals."""
    return _int_at_least(text, 1)


def nonneg_int(text: str) -> int:
    return _int_at_least(text, 0)


Section = Literal["engine", "server", "sampling"]


@dataclass(frozen=True)
class EngineFlag:
    """One command-line flag and the `EngineConfig.from_flags` keyword it sets."""

    flag: str  # "--max-context"
    keyword: str  # "max_context": a field of CacheConfig, SchedulerConfig or EngineConfig
    help: str
    parse: Callable[[str], Any] | None = int_or_text  # None: a switch, which sets `given`
    given: Any = False  # a switch's value when it is given (not given: the config's default)
    metavar: str | None = None
    section: Section = "engine"
    negatable: bool = False  # a switch offered as `--x` / `--no-x` (True / False; neither: the default)


ENGINE_FLAGS: tuple[EngineFlag, ...] = (
    EngineFlag("--max-context", "max_context", "longest prompt + output, in tokens"),
    EngineFlag("--kv-capacity", "kv_capacity", "auto | N tokens (>= max-context; default: one max-context)"),
    EngineFlag("--prefill-chunk", "prefill_chunk", "prefill tokens of one step, a multiple of 128"),
    EngineFlag(
        "--prefill-chunk-decoding",
        "prefill_chunk_decoding",
        "prefill tokens of a step that also carries decode rows (bounds their inter-token latency); "
        "a multiple of 128, <= --prefill-chunk; default min(prefill-chunk, 2048)",
        metavar="N",
    ),
    EngineFlag(
        "--kv-dtype", "kv_dtype", "KV cache storage", parse=str, metavar="{" + ",".join(KV_DTYPES) + "}"
    ),
    EngineFlag("--no-prefix-reuse", "prefix_reuse", "never reuse a cached prompt prefix", parse=None),
    EngineFlag("--no-cuda-graph", "cuda_graph", "run every decode step eagerly (debugging)", parse=None),
    EngineFlag(
        "--no-warmup",
        "warmup",
        "skip running the first-use step shapes at startup (on a GPU they compile/autotune kernels: "
        "without warm-up the first requests wait for that)",
        parse=None,
    ),
    EngineFlag(
        "--overlap",
        "overlap",
        "plan the next step while the device runs this one (overlap scheduling; default: on with CUDA, off "
        "on the CPU); --no-overlap runs each step synchronously",
        parse=None,
        given=True,
        negatable=True,
    ),
    EngineFlag(
        "--spec",
        "spec",
        "speculative decoding: 'mtp' drafts with the model's MTP head, 'dflash' with the DFlash block-diffusion "
        "companion a Qwen3.6-35B-A3B artifact carries (text only; not with --host-kv-cache-mib); the full model "
        "verifies (greedy output unchanged; sampling keeps the target distribution)",
        parse=str,
        metavar="{" + ",".join(SPEC_METHODS) + "}",
    ),
    EngineFlag(
        "--draft-tokens",
        "draft_tokens",
        f"drafts per speculative round, 1..5 with --spec mtp, 1..15 with --spec dflash (default {DEFAULT_DRAFT_TOKENS})",
        metavar="K",
    ),
    EngineFlag(
        "--lm-head-draft",
        "lm_head_draft",
        "with --spec mtp: propose drafts from the artifact's reduced output head (131,072 rows; verification "
        "keeps the full head); refused when the artifact has none",
        parse=None,
        given=True,
    ),
    EngineFlag(
        "--gpu-memory-limit",
        "gpu_memory_limit",
        "cap the engine's device memory at this many GiB, as on a smaller card (e.g. 32 for an RTX 5090); "
        "--kv-capacity auto sizes the KV pool within it; the CUDA context is outside the cap",
        parse=float_or_text,
        metavar="GiB",
    ),
    EngineFlag(
        "--vision",
        "vision",
        "load the vision tower and accept images and video (without it media are refused: vision_disabled)",
        parse=None,
        given=True,
    ),
    EngineFlag(
        "--max-media-tokens", "max_media_tokens", "media placeholder tokens per request, with --vision"
    ),
    EngineFlag(
        "--allow-remote-media",
        "allow_remote_media",
        "fetch http(s) image / video URLs (size and time limited); without it only data URIs and files",
        parse=None,
        given=True,
        section="server",
    ),
    EngineFlag("--max-concurrency", "max_concurrency", "lanes, 1..8", section="server"),
    EngineFlag("--max-pending-requests", "max_pending_requests", "queued requests", section="server"),
    EngineFlag("--pending-timeout-ms", "pending_timeout_ms", "longest wait in the queue", section="server"),
    EngineFlag(
        "--burst-wait-ms",
        "burst_wait_ms",
        "an idle engine holds its first step up to this long for requests already received and still being "
        "templated, so a burst shares one batched prefill; a busy engine never waits; 0 = off",
        metavar="MS",
        section="server",
    ),
    EngineFlag(
        "--host-kv-cache-mib",
        "host_kv_cache_mib",
        "park evicted sessions' KV + GDN state in this much host RAM and restore by copy; 0 = off",
        section="server",
    ),
    EngineFlag(
        "--default-max-tokens",
        "default_max_tokens",
        "output budget of a request that sets none",
        section="server",
    ),
    EngineFlag(
        "--greedy",
        "greedy",
        "temperature 0, whatever else is set",
        parse=None,
        given=True,
        section="sampling",
    ),
)


def config_defaults() -> dict[str, Any]:
    """Every `from_flags` keyword's default, as the config dataclasses declare it."""
    config = EngineConfig()
    return {**vars(config.cache), **vars(config.scheduler), **vars(config)}


def add_engine_flags(p: _Adder, *sections: Section) -> None:
    """The rows of `sections` (default: "engine"), in table order; each flag's value lands in
    `args.<keyword>`, None when not given."""
    defaults = config_defaults()
    for row in ENGINE_FLAGS:
        if row.section not in (sections or ("engine",)):
            continue
        if row.negatable:
            p.add_argument(row.flag, dest=row.keyword, action=argparse.BooleanOptionalAction, help=row.help)
            continue
        if row.parse is None:
            p.add_argument(row.flag, dest=row.keyword, action="store_const", const=row.given, help=row.help)
            continue
        default = defaults[row.keyword]
        shown = row.help if default is None else f"{row.help} (default {default})"
        p.add_argument(row.flag, dest=row.keyword, type=row.parse, metavar=row.metavar, help=shown)


def add_sampling_flags(p: _Adder) -> None:
    """`--greedy` (an engine switch) and the sampling defaults (`sampling_params`)."""
    add_engine_flags(p, "sampling")
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int, help=f"0..{TOP_K_DEFAULT_LIMIT}")
    p.add_argument("--min-p", type=float)
    p.add_argument("--presence-penalty", type=float)
    p.add_argument("--frequency-penalty", type=float)
    p.add_argument("--seed", type=int)
    tiers = "/".join(str(EFFORT_THINKING_BUDGETS[t]) for t in REASONING_EFFORTS[1:-1])
    p.add_argument(
        "--reasoning-effort",
        choices=REASONING_EFFORTS,
        help=f"default thinking tier: none = thinking off; minimal/low/medium/high/xhigh = a thinking budget of "
        f"{tiers} reasoning tokens; max = no budget (requests may choose their own)",
    )
    p.add_argument(
        "--thinking-budget",
        type=nonneg_int,
        metavar="N",
        help="default thinking budget: after N reasoning tokens the engine closes the reasoning (wins over "
        "--reasoning-effort's budget)",
    )


def thinking_default(args: argparse.Namespace) -> bool | None:
    """Thinking on/off as `--reasoning-effort` sets it (None: the flag is not given)."""
    return None if args.reasoning_effort is None else effort_thinking(args.reasoning_effort)[0]


def engine_config(args: argparse.Namespace, artifact: str | None) -> EngineConfig:
    """`EngineConfig` from the table's flags that were given; ValueError (field, value, rule) when refused."""
    given = {row.keyword: getattr(args, row.keyword, None) for row in ENGINE_FLAGS}
    return EngineConfig.from_flags(artifact, **{k: v for k, v in given.items() if v is not None})


def sampling_params(args: argparse.Namespace, **more: Any) -> SamplingParams:
    """`SamplingParams` from `add_sampling_flags`; `more`: max_tokens, stop, ... ValueError when refused."""
    top_k = args.top_k
    if top_k is not None and not 0 <= top_k <= TOP_K_DEFAULT_LIMIT:
        raise ValueError(f"top_k={top_k!r}: must be in 0..{TOP_K_DEFAULT_LIMIT}")
    budget = args.thinking_budget
    if budget is None and args.reasoning_effort is not None:
        budget = effort_thinking(args.reasoning_effort)[1]
    return SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=top_k,
        min_p=args.min_p,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        seed=args.seed,
        thinking_budget=budget,
        **more,
    )
