"""`ninfer`: one generation from the command line.

    ninfer ARTIFACT (--prompt TEXT | --messages FILE) [--max-new N] [--greedy] [--seed N] ...

The prompt goes through the model's chat template (a user message, or the messages of FILE: a JSON
list of messages, or an object with "messages" and optional "tools"). With `--vision`, user messages may hold
`image_url` / `video_url` parts whose url is a file path or a data URI; without it such parts are refused
(exit status 2), never dropped. The answer streams to stdout;
loading progress, the reasoning, timing and throughput go to stderr, so `ninfer ... > answer.txt`
keeps only the answer. Flags map 1:1 to `EngineConfig` fields (engine/flags.py's table, the same rows
`ninfer-serve` offers; the rules are engine/config.py's) and `SamplingParams`.
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
from engine.flags import (
    add_engine_flags,
    add_sampling_flags,
    engine_config,
    sampling_params,
    thinking_default,
)
from engine.media.expand import expand_prompt, load_source, media_parts
from engine.media.image import MediaError
from engine.request import FinishEvent, FinishKind, SamplingParams, TokenEvent
from engine.tokenizer import IncrementalDetokenizer


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ninfer", description="Generate one answer with a .ninfer model.")
    p.add_argument("artifact", help="path of the .ninfer artifact")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="the user message")
    source.add_argument(
        "--messages", type=Path, help="JSON file: a list of chat messages (or {messages, tools})"
    )
    p.add_argument("--max-new", type=int, default=256, help="maximum tokens to generate (default 256)")
    add_engine_flags(p, "engine")
    add_sampling_flags(p)
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


def run(
    args: argparse.Namespace, config: EngineConfig, params: SamplingParams, out: TextIO, err: TextIO
) -> int:
    from engine.core import EngineCore, load_artifact  # torch and the model stack: after parsing

    messages, tools = _messages(args)
    messages, sources = media_parts(messages)
    if sources and not config.vision:  # refused, never dropped
        raise MediaError(f"the messages hold {len(sources)} image / video part(s): run with --vision")
    media = [(kind, load_source(source)) for kind, source in sources]
    print(f"loading {args.artifact} ...", file=err)
    start = time.perf_counter()
    loaded = load_artifact(
        args.artifact,
        device=args.device,
        with_mtp=config.spec == "mtp",
        lm_head_draft=config.lm_head_draft,
        with_dflash=config.spec == "dflash",
        with_vision=config.vision,
    )
    core = EngineCore(loaded.model, loaded.tokenizer, config, vision=loaded.vision)
    print(f"loaded {loaded.model_id} in {time.perf_counter() - start:.1f} s", file=err)

    tokenizer = loaded.tokenizer
    thinking = not args.no_thinking and thinking_default(args) is not False
    text = tokenizer.apply_chat_template(messages, tools=tools, enable_thinking=thinking)
    prompt_ids = tokenizer.encode(text)
    prompt_media = None
    if media:
        assert loaded.vision is not None
        vision = loaded.vision
        prompt_ids, prompt_media = expand_prompt(prompt_ids, media, vision.tokens, vision.processor,
                                                 tokenizer.encode, config.max_media_tokens)  # fmt: skip
    rejection = core.add_request("cli", prompt_ids, params, thinking=thinking, media=prompt_media)
    if rejection is not None:
        print(f"error: {rejection.reason.message}", file=err)
        return 2
    resolved = core.resolve(params, thinking=thinking)
    in_reasoning = prompt_ends_in_reasoning(text)
    # Stop strings cut only the answer (as in the engine): the reasoning is shown through a detokenizer
    # without them, and the answer after `</think>` through one with them.
    detok = IncrementalDetokenizer(tokenizer, stop=() if in_reasoning else resolved.stop)
    think_end = tokenizer.special_ids.think_end_id
    parser = StreamingParser(tools, in_reasoning=in_reasoning)

    def text_of(token_ids: Sequence[int]) -> str:
        nonlocal detok, in_reasoning
        if not in_reasoning or think_end is None or think_end not in token_ids:
            return detok.add_many(token_ids)
        cut = list(token_ids).index(think_end) + 1
        shown = detok.add_many(token_ids[:cut]) + detok.finish()
        in_reasoning, detok = False, IncrementalDetokenizer(tokenizer, stop=resolved.stop)
        return shown + detok.add_many(token_ids[cut:])

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
                show(parser.feed(text_of(event.token_ids)))
            elif event.request_id == "cli":
                finish = event
    show(parser.feed(detok.finish()))
    # a call the output limit cut is shown as the cut call (or nothing), never as its markup (as the API does)
    show(parser.finish(truncated=finish.reason.kind in (FinishKind.LENGTH, FinishKind.CONTEXT)))
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
    spec = finish.speculative
    if spec is not None:
        print(
            f"[spec {spec.backend} K={spec.draft_window}] {spec.rounds} rounds, {spec.accepted_tokens}/"
            f"{spec.drafted_tokens} drafts accepted ({spec.acceptance:.1%}), {spec.tokens_per_round:.2f} tokens "
            f"per round, accepted per position {list(spec.accepted_per_position)}, {spec.fallback_steps} fallbacks",
            file=err,
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status 2 with the reason for a refused flag (the same words as `ninfer-serve` and `LLM()`), before
    anything is loaded; 2 also for bad input files and requests that can never fit."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = engine_config(args, args.artifact)
        params = sampling_params(args, max_tokens=args.max_new, stop=tuple(args.stop))
    except ValueError as exc:
        parser.error(str(exc))
    try:
        return run(args, config, params, sys.stdout, sys.stderr)
    except (ValueError, OSError) as exc:
        print(f"ninfer: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
