"""`ninfer`: one generation from the command line.

    ninfer ARTIFACT (--prompt TEXT | --messages FILE) [--max-new N] [--greedy] [--seed N] ...

The prompt goes through the model's chat template (a user message, or the messages of FILE: a JSON
list of messages, or an object with "messages" and optional "tools"). The answer streams to stdout;
loading progress, the reasoning, timing and throughput go to stderr, so `ninfer ... > answer.txt`
keeps only the answer. Flags map 1:1 to `EngineConfig` fields and `SamplingParams`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from engine.chat.parse import (
    ContentDelta,
    ReasoningDelta,
    StreamEvent,
    StreamingParser,
    ToolCallEvent,
    prompt_ends_in_reasoning,
)
from engine.config import EngineConfig
from engine.request import FinishEvent, SamplingParams, TokenEvent
from engine.tokenizer import IncrementalDetokenizer


def _kv_capacity(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--kv-capacity: expected 'auto' or a token count, got {value!r}"
        ) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ninfer", description="Generate one answer with a .ninfer model.")
    p.add_argument("artifact", help="path of the .ninfer artifact")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="the user message")
    source.add_argument(
        "--messages", type=Path, help="JSON file: a list of chat messages (or {messages, tools})"
    )
    p.add_argument("--max-new", type=int, default=256, help="maximum tokens to generate (default 256)")
    p.add_argument("--max-context", type=int, default=8192)
    p.add_argument("--kv-dtype", choices=["bf16", "int8"], default="bf16")
    p.add_argument("--kv-capacity", type=_kv_capacity, default=None, help="'auto' or a token count")
    p.add_argument("--prefill-chunk", type=int, default=1024)
    p.add_argument("--no-prefix-reuse", action="store_true")
    p.add_argument("--no-cuda-graph", action="store_true", help="run every decode step eagerly (debugging)")
    p.add_argument(
        "--no-warmup",
        action="store_true",
        help="skip running the first-use step shapes at startup (on a GPU they compile/autotune kernels: "
        "without warm-up the first requests wait for that)",
    )
    p.add_argument("--greedy", action="store_true", help="temperature 0, whatever else is set")
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--min-p", type=float)
    p.add_argument("--presence-penalty", type=float)
    p.add_argument("--frequency-penalty", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--no-thinking", action="store_true", help="render the template with thinking off")
    p.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    return p


def _messages(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    if args.prompt is not None:
        return [{"role": "user", "content": args.prompt}], None
    data = json.loads(args.messages.read_text(encoding="utf-8"))
    if isinstance(data, list):
        return data, None
    if isinstance(data, dict) and isinstance(data.get("messages"), list):
        return data["messages"], data.get("tools")
    raise ValueError(f"{args.messages}: expected a JSON list of messages or an object with 'messages'")


def _write(stream: TextIO, text: str) -> None:
    if text:
        stream.write(text)
        stream.flush()


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from engine.core import EngineCore, load_artifact  # torch and the model stack: after parsing

    config = EngineConfig.from_flags(
        args.artifact,
        max_context=args.max_context,
        kv_dtype=args.kv_dtype,
        kv_capacity=args.kv_capacity,
        prefill_chunk=args.prefill_chunk,
        prefix_reuse=not args.no_prefix_reuse,
        greedy=args.greedy,
        cuda_graph=not args.no_cuda_graph,
        warmup=False if args.no_warmup else None,
    )
    params = SamplingParams(
        max_tokens=args.max_new,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        seed=args.seed,
        stop=tuple(args.stop),
    )
    messages, tools = _messages(args)
    print(f"loading {args.artifact} ...", file=err)
    start = time.perf_counter()
    loaded = load_artifact(args.artifact, device=args.device)
    core = EngineCore(loaded.model, loaded.tokenizer, config)
    print(f"loaded {loaded.model_id} in {time.perf_counter() - start:.1f} s", file=err)

    tokenizer = loaded.tokenizer
    thinking = not args.no_thinking
    text = tokenizer.apply_chat_template(messages, tools=tools, enable_thinking=thinking)
    prompt_ids = tokenizer.encode(text)
    rejection = core.add_request("cli", prompt_ids, params, thinking=thinking)
    if rejection is not None:
        print(f"error: {rejection.reason.message}", file=err)
        return 2
    resolved = core.resolve(params, thinking=thinking)
    detok = IncrementalDetokenizer(tokenizer, stop=resolved.stop)
    parser = StreamingParser(tools, in_reasoning=prompt_ends_in_reasoning(text))

    def show(events: Sequence[StreamEvent]) -> None:
        for event in events:
            if isinstance(event, ReasoningDelta):
                _write(err, event.text)
            elif isinstance(event, ContentDelta):
                _write(out, event.text)
            elif isinstance(event, ToolCallEvent):
                _write(out, f"\n[tool call] {event.call.name} {event.call.arguments_json}\n")

    start = time.perf_counter()
    first_token_s = None
    finish: FinishEvent | None = None
    while finish is None:
        for event in core.step():
            if isinstance(event, TokenEvent):
                first_token_s = first_token_s or time.perf_counter() - start
                show(parser.feed(detok.add_many(event.token_ids)))
            elif event.request_id == "cli":
                finish = event
    show(parser.feed(detok.finish()))
    show(parser.finish())
    _write(out, "\n")
    elapsed = time.perf_counter() - start
    n = finish.num_output_tokens
    decode_s = elapsed - (first_token_s or 0.0)
    rate = (n - 1) / decode_s if n > 1 and decode_s > 0 else 0.0
    print(
        f"\n[{finish.reason}] {finish.num_prompt_tokens} prompt tokens, {n} generated in {elapsed:.2f} s; "
        f"time to first token {first_token_s or 0.0:.3f} s, decode {rate:.1f} tok/s",
        file=err,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args, sys.stdout, sys.stderr)
    except (ValueError, OSError) as exc:
        print(f"ninfer: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
