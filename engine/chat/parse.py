"""Reading generated text back: reasoning, content and Qwen XML tool calls (whole or streamed).

Output shape (Qwen3.5):  [<think>] REASONING </think> CONTENT [<tool_call> ... </tool_call>]*
When the prompt itself opened `<think>` (thinking on), generation starts inside the reasoning; pass
`in_reasoning=True` (see `prompt_ends_in_reasoning`).

Whitespace follows the chat template, so a parsed turn renders back to the generated text: reasoning
and each content run are trimmed where they meet `<think>`, `</think>`, a tool call and the end.

Tool calls: `<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>...</function>\\n</tool_call>`.
Values are typed from the tool's JSON schema (UPSTREAM.md 7.5): strings stay strings; `true`/`false` (any
case) become booleans for boolean parameters; numbers, objects and arrays are parsed as JSON when the
schema says so; an empty non-string value is omitted; a value that does not fit its schema is kept,
typed if it is valid JSON and a string otherwise. An undeclared tool, a duplicate parameter or malformed
structure leaves the whole block as content text, and the reason is recorded and logged. A final block
missing only `</tool_call>` is still a call. Opt-in tolerance (`calls_in_reasoning`): a tool call
inside unclosed reasoning ends the reasoning.

`parse_output` reads a finished text; `StreamingParser` reads deltas and emits the same result as
events. They are written independently and tests hold them equal under any chunking.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

THINK_START, THINK_END = "<think>", "</think>"
TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"

_FUNCTION_RE = re.compile(r"\s*<function=([^>\n]*)>(.*)</function>\s*", re.DOTALL)
_PARAMETER_RE = re.compile(r"<parameter=([^>\n]*)>(.*?)</parameter>", re.DOTALL)

Schemas = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class ParsedOutput:
    reasoning: str | None  # None: the output had no reasoning section
    content: str
    tool_calls: tuple[ToolCall, ...]
    fallbacks: tuple[str, ...]  # why some tool-call markup stayed text


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ContentDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallEvent:
    call: ToolCall


StreamEvent = ReasoningDelta | ContentDelta | ToolCallEvent


class ToolCallError(ValueError):
    """A tool-call block that cannot be a call; the message is the fallback reason."""


def prompt_ends_in_reasoning(prompt: str) -> bool:
    """True when the prompt's last turn opened `<think>` without closing it (generation starts thinking)."""
    turn = prompt[prompt.rfind("<|im_start|>") + 1 :]
    return turn.rfind(THINK_START) > turn.rfind(THINK_END)


def tool_schemas(tools: Sequence[Mapping[str, Any]] | None) -> dict[str, Mapping[str, Any]]:
    """name -> parameters schema, from OpenAI (`{"type": "function", "function": {...}}`), flat
    (`{"name", "parameters"}`) or Anthropic (`{"name", "input_schema"}`) tool definitions."""
    schemas: dict[str, Mapping[str, Any]] = {}
    for tool in tools or ():
        spec = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
        name = spec.get("name")
        if isinstance(name, str):
            params = spec.get("parameters", spec.get("input_schema"))
            schemas[name] = params if isinstance(params, Mapping) else {}
    return schemas


def _declared_types(schema: Any) -> set[str]:
    if not isinstance(schema, Mapping):
        return set()
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list):
            return {o["type"] for o in options if isinstance(o, Mapping) and isinstance(o.get("type"), str)}
    return set()


def _fits(value: Any, types: set[str]) -> bool:
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    return (
        ("integer" in types and is_number and isinstance(value, int))
        or ("number" in types and is_number)
        or ("object" in types and isinstance(value, dict))
        or ("array" in types and isinstance(value, list))
    )


_OMIT = object()


def coerce_value(raw: str, schema: Any) -> Any:
    """The typed value of one parameter (`_OMIT` for an empty non-string)."""
    types = _declared_types(schema)
    if not types or types == {"string"}:
        return raw
    text = raw.strip()
    if not text and "string" not in types:
        return _OMIT
    if "boolean" in types and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if "null" in types and text.lower() in ("null", "none"):
        return None
    try:
        decoded = json.loads(text)
    except ValueError:
        return raw
    if _fits(decoded, types) or "string" not in types:
        return decoded  # fits the schema, or a mismatch kept as typed JSON
    return raw


def parse_tool_call(block: str, schemas: Schemas | None) -> ToolCall:
    """The call in `block` (the text between `<tool_call>` and `</tool_call>`)."""
    match = _FUNCTION_RE.fullmatch(block)
    if match is None:
        raise ToolCallError("no <function=NAME>...</function> inside <tool_call>")
    name, body = match.group(1).strip(), match.group(2)
    if not name:
        raise ToolCallError("empty function name")
    if schemas is None or name not in schemas:
        raise ToolCallError(f"undeclared tool {name!r}")
    properties = schemas[name].get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    arguments: dict[str, Any] = {}
    pos = 0
    for param in _PARAMETER_RE.finditer(body):
        if body[pos : param.start()].strip():
            raise ToolCallError(f"unexpected text inside <function={name}>")
        pos = param.end()
        key = param.group(1).strip()
        if key in arguments:
            raise ToolCallError(f"duplicate parameter {key!r} in {name!r}")
        value = param.group(2)
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        typed = coerce_value(value, properties.get(key))
        if typed is not _OMIT:
            arguments[key] = typed
    if body[pos:].strip():
        raise ToolCallError(f"unexpected text inside <function={name}>")
    return ToolCall(name, arguments)


def _trim(text: str, *, lead: bool, trail: bool) -> str:
    text = text.lstrip() if lead else text
    return text.rstrip() if trail else text


def _split_reasoning(text: str, in_reasoning: bool, calls_in_reasoning: bool) -> tuple[str | None, str]:
    stripped = text.lstrip()
    if stripped.startswith(THINK_START):
        body = stripped[len(THINK_START) :]
    elif in_reasoning:
        body = text
    else:
        return None, text
    end = body.find(THINK_END)
    call = body.find(TOOL_CALL_START) if calls_in_reasoning else -1
    if call >= 0 and (end < 0 or call < end):
        return body[:call].strip(), body[call:]  # the call closes the reasoning; keep its tag
    if end < 0:
        return body.strip(), ""
    return body[:end].strip(), body[end + len(THINK_END) :]


def parse_output(
    text: str,
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    in_reasoning: bool = False,
    calls_in_reasoning: bool = False,
) -> ParsedOutput:
    """Split a finished generation into reasoning, content and tool calls.

    `calls_in_reasoning` (tolerant, opt-in): a `<tool_call>` inside the reasoning ends the reasoning, as
    if `</think>` had come first (models sometimes call a tool without closing their thinking).
    """
    schemas = tool_schemas(tools) if tools else None
    reasoning, rest = _split_reasoning(text, in_reasoning, calls_in_reasoning)
    content, calls, fallbacks = [], [], []
    pos, run_start = 0, True  # run_start: the next content text starts a run (trim its start)
    while True:
        start = rest.find(TOOL_CALL_START, pos)
        if start < 0:
            content.append(_trim(rest[pos:], lead=run_start, trail=True))
            break
        end = rest.find(TOOL_CALL_END, start)
        block_end = len(rest) if end < 0 else end
        before = rest[pos:start]
        try:
            call = parse_tool_call(rest[start + len(TOOL_CALL_START) : block_end], schemas)
        except ToolCallError as exc:
            fallbacks.append(str(exc))
            logger.info("tool call left as text: %s", exc)
            raw_end = len(rest) if end < 0 else end + len(TOOL_CALL_END)
            content.append(_trim(before + rest[start:raw_end], lead=run_start, trail=end < 0))
            run_start = run_start and not (before + rest[start:raw_end]).strip()
        else:
            content.append(_trim(before, lead=run_start, trail=True))
            calls.append(call)
            run_start = True
        if end < 0:
            break
        pos = end + len(TOOL_CALL_END)
    return ParsedOutput(reasoning, "".join(content), tuple(calls), tuple(fallbacks))


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class StreamingParser:
    """Feed text deltas; get reasoning deltas, content deltas and completed tool calls.

    Nothing that might still become `</think>` or `<tool_call>` is emitted as text, and a tool call's
    markup is never shown unless the block turns out not to be a call (then it is emitted as content).
    """

    def __init__(
        self,
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        in_reasoning: bool = False,
        calls_in_reasoning: bool = False,
    ) -> None:
        self._schemas = tool_schemas(tools) if tools else None
        self._in_reasoning = in_reasoning
        self._calls_in_reasoning = calls_in_reasoning
        self._mode = "start"  # start -> reasoning | content; content <-> tool
        self._buf = ""  # received, not yet consumed
        self._run_start = True  # trim the start of the next text
        self._ws = ""  # trailing whitespace of the current run, held until more text follows
        self._ws_before_call = ""  # the run's held whitespace when a block opened
        self.fallbacks: list[str] = []

    def feed(self, delta: str) -> list[StreamEvent]:
        self._buf += delta
        events: list[StreamEvent] = []
        while self._step(events, final=False):
            pass
        return events

    def finish(self) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        while self._step(events, final=True):
            pass
        if self._mode == "tool":
            self._close_block(self._buf, closed=False, events=events)
        elif self._buf:
            self._text(self._buf, events)
        self._buf = ""
        return events

    def _step(self, events: list[StreamEvent], *, final: bool) -> bool:
        """Consume what can be decided now; True when the mode changed and another pass may help."""
        buf = self._buf
        if self._mode == "start":
            stripped = buf.lstrip()
            if not final and (not stripped or (THINK_START.startswith(stripped) and stripped != THINK_START)):
                return False
            if stripped.startswith(THINK_START):
                self._buf, self._mode = stripped[len(THINK_START) :], "reasoning"
            else:
                self._mode = "reasoning" if self._in_reasoning else "content"
            return True
        if self._mode == "tool":
            end = buf.find(TOOL_CALL_END)
            if end < 0:
                return False
            self._buf = buf[end + len(TOOL_CALL_END) :]
            self._mode = "content"
            self._close_block(buf[:end], closed=True, events=events)
            return True
        if self._mode == "reasoning":
            tags = (THINK_END, TOOL_CALL_START) if self._calls_in_reasoning else (THINK_END,)
        else:
            tags = (TOOL_CALL_START,)
        found = [(at, tag) for tag in tags if (at := buf.find(tag)) >= 0]
        if not found:
            keep = 0 if final else max(_partial_suffix(buf, tag) for tag in tags)
            self._text(buf[: len(buf) - keep], events)
            self._buf = buf[len(buf) - keep :]
            return False
        at, tag = min(found)
        self._text(buf[:at], events)
        if self._mode == "reasoning":
            # `</think>` is consumed; a `<tool_call>` that ends the reasoning stays for content mode.
            self._buf = buf[at + len(tag) :] if tag == THINK_END else buf[at:]
            self._mode, self._ws, self._run_start = "content", "", True
        else:
            self._buf = buf[at + len(tag) :]
            self._mode, self._ws_before_call, self._ws = "tool", self._ws, ""
        return True

    def _text(self, text: str, events: list[StreamEvent]) -> None:
        if self._run_start:
            text = text.lstrip()
            if not text:
                return
            self._run_start = False
        body = text.rstrip()
        if not body:
            self._ws += text
            return
        out = self._ws + body
        self._ws = text[len(body) :]
        events.append(ReasoningDelta(out) if self._mode == "reasoning" else ContentDelta(out))

    def _close_block(self, block: str, *, closed: bool, events: list[StreamEvent]) -> None:
        try:
            call = parse_tool_call(block, self._schemas)
        except ToolCallError as exc:
            self.fallbacks.append(str(exc))
            logger.info("tool call left as text: %s", exc)
            self._mode = "content"
            raw = TOOL_CALL_START + block + (TOOL_CALL_END if closed else "")
            self._text(self._ws_before_call + raw, events)
        else:
            events.append(ToolCallEvent(call))
            self._run_start = True
        self._ws_before_call = ""


def collect(events: Sequence[StreamEvent]) -> tuple[str, str, list[ToolCall]]:
    """(reasoning, content, tool calls) joined from a stream of events."""
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    return reasoning, content, [e.call for e in events if isinstance(e, ToolCallEvent)]
