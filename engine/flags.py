"""The engine and sampling flags that `ninfer` (engine/cli.py) and `ninfer-serve` (api/serve.py) share: one
definition of each flag, its type check and help, and one mapping from parsed flags to `EngineConfig` /
`SamplingParams`. Each program adds its own flags (lanes and queueing belong to the server, `--max-new` to
the one-shot CLI) and passes them on as keywords.
"""

from __future__ import annotations

import argparse
from typing import Any, Protocol

from engine.config import KV_DTYPES, EngineConfig
from engine.request import SamplingParams
from engine.sampling import REASONING_EFFORTS, effort_thinking


class _Adder(Protocol):  # an ArgumentParser or one of its argument groups
    def add_argument(self, *names: str, **kwargs: Any) -> Any: ...


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"{value} must be >= {low}")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def nonneg_int(text: str) -> int:
    return _int_at_least(text, 0)


def kv_capacity(text: str) -> int | str:
    """`auto` or a positive token count."""
    return "auto" if text == "auto" else positive_int(text)


def add_engine_flags(p: _Adder) -> None:
    """Context, KV pool, prefill chunks and the GPU switches."""
    p.add_argument(
        "--max-context", type=positive_int, default=8192, help="longest prompt + output, in tokens"
    )
    p.add_argument("--kv-capacity", type=kv_capacity, default=None, help="auto | N tokens (>= max-context)")
    p.add_argument("--prefill-chunk", type=positive_int, default=1024, help="a multiple of 128")
    p.add_argument(
        "--prefill-chunk-decoding",
        type=positive_int,
        default=None,
        metavar="N",
        help="prefill tokens of a step that also carries decode rows (bounds their inter-token latency); "
        "a multiple of 128, <= --prefill-chunk; default min(prefill-chunk, 2048)",
    )
    p.add_argument("--kv-dtype", choices=KV_DTYPES, default="bf16")
    p.add_argument("--no-prefix-reuse", action="store_true")
    p.add_argument("--no-cuda-graph", action="store_true", help="run every decode step eagerly (debugging)")
    p.add_argument(
        "--no-warmup",
        action="store_true",
        help="skip running the first-use step shapes at startup (on a GPU they compile/autotune kernels: "
        "without warm-up the first requests wait for that)",
    )


def add_sampling_flags(p: _Adder) -> None:
    p.add_argument("--greedy", action="store_true", help="temperature 0, whatever else is set")
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--min-p", type=float)
    p.add_argument("--presence-penalty", type=float)
    p.add_argument("--frequency-penalty", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument(
        "--reasoning-effort",
        choices=REASONING_EFFORTS,
        help="default thinking tier: none = thinking off; minimal/low/medium/high/xhigh = a thinking budget of "
        "512/2048/8192/16384/32768 reasoning tokens; max = no budget (requests may choose their own)",
    )
    p.add_argument(
        "--thinking-budget",
        type=nonneg_int,
        metavar="N",
        help="default thinking budget: after N reasoning tokens the engine closes the reasoning (wins over "
        "--reasoning-effort's budget)",
    )


def engine_config(args: argparse.Namespace, artifact: str | None, **more: Any) -> EngineConfig:
    """`EngineConfig` from `add_engine_flags` + `--greedy`; `more`: the program's own engine options."""
    return EngineConfig.from_flags(
        artifact,
        max_context=args.max_context,
        kv_capacity=args.kv_capacity,
        prefill_chunk=args.prefill_chunk,
        prefill_chunk_decoding=args.prefill_chunk_decoding,
        kv_dtype=args.kv_dtype,
        prefix_reuse=not args.no_prefix_reuse,
        greedy=args.greedy,
        cuda_graph=not args.no_cuda_graph,
        warmup=False if args.no_warmup else None,
        **more,
    )


def thinking_default(args: argparse.Namespace) -> bool | None:
    """Thinking on/off as `--reasoning-effort` sets it (None: the flag is not given)."""
    return None if args.reasoning_effort is None else effort_thinking(args.reasoning_effort)[0]


def sampling_params(args: argparse.Namespace, **more: Any) -> SamplingParams:
    """`SamplingParams` from `add_sampling_flags`; `more`: max_tokens, stop, ..."""
    budget = args.thinking_budget
    if budget is None and args.reasoning_effort is not None:
        budget = effort_thinking(args.reasoning_effort)[1]
    return SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        seed=args.seed,
        thinking_budget=budget,
        **more,
    )
