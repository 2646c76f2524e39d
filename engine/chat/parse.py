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
missing only `</tool_call>` is still a call.

Cut calls (`truncated`: the output limit, max_tokens or the context, ended the text): a final block that is not
a whole call is never text. When its `<function=NAME>` arrived and names a declared tool it is a call
(`cut_tool_call`) whose `arguments` hold the parameters whose values arrived whole and whose `partial_json` is
the JSON text of the arguments as far as they arrived (a prefix of what the whole call's would be, unclosed:
OpenAI's arguments string of a call cut by the limit); otherwise it is dropped (the reason is recorded). A
held prefix of an open tag at the end is dropped too.

Nesting: a parameter value may itself hold tool-call markup (an agent writing code or docs about tool
calls). A block ends at the `</tool_call>` that balances its `<tool_call>` (depth matching) when that block
is a call; otherwise, or when nothing balances it, at the first close tag as before. A value may hold
`</parameter>` too: a value ends at the `</parameter>` that the next parameter or `</function>` follows. Opt-in tolerance (`calls_in_reasoning`): a tool call
inside unclosed reasoning ends the reasoning.

Opt-in recoveries (`tolerant`, the server's `--tolerant-tool-calls`; UPSTREAM.md 7.5): drifted wrappers
(`<tool_calls>`, `<toolcall>`, `<tool-call>`, `<function_call>` and their closing forms, any close ending
any open); a block that a new open tag ends before its `</tool_call>`; and, inside a block, a doubled `<<`,
a dropped `<`, leaked `<|im_start|>` / `<|im_end|>` markers, a missing `function` keyword (`<=NAME>` or
`<NAME>` for a declared tool) and a missing `</function>`. Repairs are tried only after the strict
parse failed, so a well-formed call is never changed; a repaired call is logged, and a block that still
fails stays text with the strict reason.

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

from engine.structured.schema import resolved

logger = logging.getLogger(__name__)

THINK_START, THINK_END = "<think>", "</think>"
TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"

TOLERANT_OPENS = (TOOL_CALL_START, "<tool_calls>", "<toolcall>", "<tool-call>", "<function_call>")
TOLERANT_CLOSES = (TOOL_CALL_END, "</tool_calls>", "</toolcall>", "</tool-call>", "</function_call>")

_FUNCTION_RE = re.compile(r"\s*<function=([^>\n]*)>(.*)</function>\s*", re.DOTALL)
_PARAMETER_OPEN_RE = re.compile(r"<parameter=([^>\n]*)>")
_PARAMETER_TAG_RE = re.compile(r"<parameter=[^>\n]*>|</parameter>")
PARAMETER_END = "</parameter>"
_AFTER_VALUE_RE = re.compile(r"\s*(?:<parameter=|</function>|$)")
_AFTER_LAST_VALUE_RE = re.compile(r"\s*(?:<parameter=|$)")

Schemas = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    partial_json: str | None = None  # a call the output limit cut: its arguments' JSON text so far (unclosed)

    @property
    def arguments_json(self) -> str:
        """The arguments as JSON text; of a cut call, the text as far as it arrived."""
        if self.partial_json is not None:
            return self.partial_json
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
        function = tool.get("function")
        spec = function if isinstance(function, Mapping) else tool
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


def _value_end(body: str, start: int) -> int:
    """Where the value starting at `start` ends (its `</parameter>`), or -1. A value may hold parameter markup:
    the end is the first `</parameter>` that balances the tags inside the value and that the next parameter or
    `</function>` follows; failing that, the first `</parameter>` that the next parameter or the end follows
    (a value holding a lone `</parameter>`)."""
    ends = [m.start() for m in _PARAMETER_TAG_RE.finditer(body, start) if m.group() == PARAMETER_END]
    for end in ends:
        if _balanced_parameters(body[start:end]) and _AFTER_VALUE_RE.match(body, end + len(PARAMETER_END)):
            return end
    return next((e for e in ends if _AFTER_LAST_VALUE_RE.match(body, e + len(PARAMETER_END))), -1)


def _balanced_parameters(value: str) -> bool:
    depth = 0
    for tag in _PARAMETER_TAG_RE.findall(value):
        depth += -1 if tag == PARAMETER_END else 1
        if depth < 0:
            return False
    return depth == 0


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
    while (param := _PARAMETER_OPEN_RE.search(body, pos)) is not None:
        if body[pos : param.start()].strip():
            raise ToolCallError(f"unexpected text inside <function={name}>")
        end = _value_end(body, param.end())
        if end < 0:
            break  # an unclosed parameter: the rest is unexpected text
        pos = end + len(PARAMETER_END)
        key = param.group(1).strip()
        if key in arguments:
            raise ToolCallError(f"duplicate parameter {key!r} in {name!r}")
        value = body[param.end() : end]
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        typed = coerce_value(value, resolved(properties.get(key), schemas[name]))  # `$ref`s followed
        if typed is not _OMIT:
            arguments[key] = typed
    if body[pos:].strip():
        raise ToolCallError(f"unexpected text inside <function={name}>")
    return ToolCall(name, arguments)


_FUNCTION_OPEN_RE = re.compile(r"\s*<function=([^>\n]*)>")


def cut_tool_call(block: str, schemas: Schemas | None) -> ToolCall:
    """The call in a block the output limit cut (`block`: the text after `<tool_call>`): whole when only
    `</tool_call>` is missing; otherwise the parameters whose values arrived whole, and `partial_json`. Raises
    `ToolCallError` when the name did not arrive or is not a declared tool (the block is then dropped)."""
    block = block[: len(block) - max(_partial_suffix(block, tag) for tag in TOLERANT_CLOSES)]
    try:
        return parse_tool_call(block, schemas)
    except ToolCallError:
        pass
    match = _FUNCTION_OPEN_RE.match(block)
    if match is None:
        raise ToolCallError("cut by the output limit before the tool's name (dropped)")
    name = match.group(1).strip()
    if schemas is None or name not in schemas:
        raise ToolCallError(f"cut by the output limit: undeclared tool {name!r} (dropped)")
    properties = schemas[name].get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    body = block[match.end() :]
    body = body[: len(body) - max(_partial_suffix(body, tag) for tag in ("<parameter=", "</function>"))]
    arguments: dict[str, Any] = {}
    parts: list[str] = []  # `"key": value` JSON texts, the last one maybe cut
    pos = 0
    while (param := _PARAMETER_OPEN_RE.search(body, pos)) is not None:
        key = param.group(1).strip()
        if body[pos : param.start()].strip() or key in arguments:
            break  # malformed from here on: the arguments end before it
        schema = resolved(properties.get(key), schemas[name])
        end = _value_end(body, param.end())
        value = body[param.end() : None if end < 0 else end].removeprefix("\n")
        if end < 0:  # the value the limit cut
            value = value[: len(value) - _partial_suffix(value, PARAMETER_END)].removesuffix("\n")
            parts.append(f"{_json(key)}: {_partial_value(value, schema)}")
            break
        typed = coerce_value(value.removesuffix("\n"), schema)
        if typed is not _OMIT:
            arguments[key] = typed
            parts.append(f"{_json(key)}: {_json(typed)}")
        pos = end + len(PARAMETER_END)
    return ToolCall(name, arguments, partial_json="{" + ", ".join(parts))


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _partial_value(raw: str, schema: Any) -> str:
    """The JSON text of a value the limit cut: an open string for a parameter that may be a string (or is
    untyped), else the raw text (the start of a number, boolean, object or array)."""
    types = _declared_types(schema)
    if not types or "string" in types:
        return _json(raw)[:-1]
    return raw.strip()


_DOUBLED_LT_RE = re.compile(r"<<+(?=/?(?:function|parameter)\b)")
_DROPPED_LT_RE = re.compile(r"(?<![<\w/])(/?(?:function|parameter)(?:=[^<>\n]*)?>)")
_NO_KEYWORD_RE = re.compile(r"<=([^<>\n]*)>")
_LEAKED_MARKER_RE = re.compile(r"<\|im_start\|>(?:assistant\n?)?|<\|im_end\|>")


def repair_tool_call(block: str, schemas: Schemas | None) -> tuple[str, list[str]]:
    """`block` with the tolerated drift undone, and what was repaired (empty: nothing to repair)."""
    fixes: list[str] = []

    def sub(pattern: re.Pattern[str], repl: str, text: str, what: str) -> str:
        out, n = pattern.subn(repl, text)
        if n:
            fixes.append(what)
        return out

    text = sub(_LEAKED_MARKER_RE, "", block, "leaked <|im_start|>")
    text = sub(_DOUBLED_LT_RE, "<", text, "doubled <<")
    text = sub(_DROPPED_LT_RE, r"<\1", text, "dropped <")
    text = sub(_NO_KEYWORD_RE, r"<function=\1>", text, "missing function keyword")
    if "<function=" not in text:
        for name in schemas or ():
            bare = re.compile(rf"<{re.escape(name)}>(.*?)(?:</{re.escape(name)}>|</function>|$)", re.DOTALL)
            text = sub(bare, rf"<function={name}>\1</function>", text, "missing function keyword")
            if "<function=" in text:
                break
    if "<function=" in text and "</function>" not in text:
        text = text.rstrip() + "\n</function>\n"
        fixes.append("missing </function>")
    return text, fixes


def read_tool_call(block: str, schemas: Schemas | None, *, tolerant: bool) -> ToolCall:
    """`parse_tool_call`, then (tolerant) the same on the repaired block; raises the strict reason."""
    try:
        return parse_tool_call(block, schemas)
    except ToolCallError:
        if not tolerant:
            raise
        repaired, fixes = repair_tool_call(block, schemas)
        if not fixes:
            raise
        try:
            call = parse_tool_call(repaired, schemas)
        except ToolCallError:
            pass
        else:
            logger.info("tool call recovered (%s): %r", ", ".join(fixes), call.name)
            return call
        raise


def _first(text: str, tags: Sequence[str], pos: int = 0) -> tuple[int, str]:
    """(position, tag) of the earliest of `tags` in `text` from `pos`; (-1, "") when none occurs."""
    found = [(at, tag) for tag in tags if (at := text.find(tag, pos)) >= 0]
    return min(found) if found else (-1, "")


def _balanced_close(text: str, pos: int, opens: Sequence[str], closes: Sequence[str]) -> tuple[int, str]:
    """The close tag that balances a block whose body starts at `pos`, when an open tag comes before the first
    close (nesting); (-1, "") when the block does not nest or nothing balances it (yet)."""
    first_open = _first(text, opens, pos)[0]
    first_close = _first(text, closes, pos)[0]
    if first_open < 0 or (0 <= first_close < first_open):
        return -1, ""
    depth, at = 1, pos
    while True:
        close_at, close_tag = _first(text, closes, at)
        if close_at < 0:
            return -1, ""
        open_at, open_tag = _first(text, opens, at)
        if 0 <= open_at < close_at:
            depth, at = depth + 1, open_at + len(open_tag)
            continue
        depth, at = depth - 1, close_at + len(close_tag)
        if depth == 0:
            return close_at, close_tag


def _unbalanced(text: str, pos: int, opens: Sequence[str], closes: Sequence[str]) -> bool:
    """Whether the block whose body starts at `pos` nests and nothing balances it (yet)."""
    first_open, first_close = _first(text, opens, pos)[0], _first(text, closes, pos)[0]
    nests = first_open >= 0 and (first_close < 0 or first_open < first_close)
    return nests and _balanced_close(text, pos, opens, closes)[0] < 0


def _nested_call(
    text: str, pos: int, opens: Sequence[str], closes: Sequence[str], schemas: Schemas | None, tolerant: bool
) -> tuple[ToolCall, int] | None:
    """(call, end of its close tag) when the block from `pos` nests and its balanced block is a call."""
    end, close_tag = _balanced_close(text, pos, opens, closes)
    if end < 0:
        return None
    try:
        return read_tool_call(text[pos:end], schemas, tolerant=tolerant), end + len(close_tag)
    except ToolCallError:
        return None


def _trim(text: str, *, lead: bool, trail: bool) -> str:
    text = text.lstrip() if lead else text
    return text.rstrip() if trail else text


def _split_reasoning(
    text: str, in_reasoning: bool, calls_in_reasoning: bool, opens: Sequence[str]
) -> tuple[str | None, str]:
    stripped = text.lstrip()
    if stripped.startswith(THINK_START):
        body = stripped[len(THINK_START) :]
    elif in_reasoning:
        body = text
    else:
        return None, text
    end = body.find(THINK_END)
    call = _first(body, opens)[0] if calls_in_reasoning else -1
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
    tolerant: bool = False,
    truncated: bool = False,
) -> ParsedOutput:
    """Split a finished generation into reasoning, content and tool calls.

    `calls_in_reasoning` (tolerant, opt-in): a `<tool_call>` inside the reasoning ends the reasoning, as
    if `</think>` had come first (models sometimes call a tool without closing their thinking).
    `tolerant` (opt-in): the wrapper and in-block recoveries of the module docstring.
    `truncated`: the output limit ended `text` (cut calls, module docstring).
    """
    schemas = tool_schemas(tools) if tools else None
    opens = TOLERANT_OPENS if tolerant else (TOOL_CALL_START,)
    closes = TOLERANT_CLOSES if tolerant else (TOOL_CALL_END,)
    reasoning, rest = _split_reasoning(text, in_reasoning, calls_in_reasoning, opens)
    content, calls, fallbacks = [], [], []
    pos, run_start = 0, True  # run_start: the next content text starts a run (trim its start)
    while True:
        start, open_tag = _first(rest, opens, pos)
        if start < 0:
            tail = rest[pos:]
            if truncated:  # the start of an open tag is not text
                tail = tail[: len(tail) - max(_partial_suffix(tail, tag) for tag in opens)]
            content.append(_trim(tail, lead=run_start, trail=True))
            break
        body_start = start + len(open_tag)
        nested = _nested_call(rest, body_start, opens, closes, schemas, tolerant)
        if nested is not None:
            content.append(_trim(rest[pos:start], lead=run_start, trail=True))
            calls.append(nested[0])
            run_start, pos = True, nested[1]
            continue
        end, close_tag = _first(rest, closes, body_start)
        reopen = _first(rest, opens, body_start)[0] if tolerant else -1
        if reopen >= 0 and (end < 0 or reopen < end):  # a new block opens first: this one ends there
            end, close_tag = reopen, ""
        block_end = len(rest) if end < 0 else end
        before = rest[pos:start]
        if truncated and (end < 0 or _unbalanced(rest, body_start, opens, closes)):  # the limit cut the block
            content.append(_trim(before, lead=run_start, trail=True))
            try:
                calls.append(cut_tool_call(rest[body_start:], schemas))
            except ToolCallError as exc:
                fallbacks.append(str(exc))
                logger.info("tool call cut: %s", exc)
            break
        try:
            call = read_tool_call(rest[body_start:block_end], schemas, tolerant=tolerant)
        except ToolCallError as exc:
            fallbacks.append(str(exc))
            logger.info("tool call left as text: %s", exc)
            raw_end = len(rest) if end < 0 else end + len(close_tag)
            if close_tag == "" and end >= 0:  # ended by a new open: its trailing space leads the next run
                raw_end = start + len(rest[start:raw_end].rstrip())
            raw = before + rest[start:raw_end]
            content.append(_trim(raw, lead=run_start, trail=end < 0))
            run_start = run_start and not raw.strip()
            if end < 0:
                break
            pos = raw_end
            continue
        content.append(_trim(before, lead=run_start, trail=True))
        calls.append(call)
        run_start = True
        if end < 0:
            break
        pos = end + len(close_tag)
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
        tolerant: bool = False,
    ) -> None:
        self._schemas = tool_schemas(tools) if tools else None
        self._in_reasoning = in_reasoning
        self._calls_in_reasoning = calls_in_reasoning
        self._tolerant = tolerant
        self._opens = TOLERANT_OPENS if tolerant else (TOOL_CALL_START,)
        self._closes = TOLERANT_CLOSES if tolerant else (TOOL_CALL_END,)
        self._mode = "start"  # start -> reasoning | content; content <-> tool
        self._buf = ""  # received, not yet consumed
        self._open_tag = ""  # the tag that opened the current block
        self._run_start = True  # trim the start of the next text
        self._ws = ""  # trailing whitespace of the current run, held until more text follows
        self._ws_before_call = ""  # the run's held whitespace when a block opened
        self._truncated = False  # finish(truncated=True): the output limit ended the text
        self.fallbacks: list[str] = []

    def feed(self, delta: str) -> list[StreamEvent]:
        self._buf += delta
        events: list[StreamEvent] = []
        while self._step(events, final=False):
            pass
        return events

    def in_tool_call(self) -> bool:
        """Whether the text fed so far ends inside a tool call's block, or in the answer on what may still
        open one (a held prefix of `<tool_call>`): text there is markup, not the answer."""
        if self._mode == "start":  # undecided: a held "<" may open <think> or a call
            held = self._buf.lstrip()
            return bool(held) and any(tag.startswith(held) for tag in self._opens)
        return self._mode == "tool" or (self._mode == "content" and bool(self._buf))

    def finish(self, *, truncated: bool = False) -> list[StreamEvent]:
        """The events of the text held back. `truncated`: the output limit ended the text (an unclosed call
        is a cut call or nothing, a held prefix of an open tag is dropped: module docstring)."""
        self._truncated = truncated
        events: list[StreamEvent] = []
        while self._step(events, final=True):
            pass
        if self._mode == "tool" and truncated:
            try:
                events.append(ToolCallEvent(cut_tool_call(self._buf, self._schemas)))
            except ToolCallError as exc:
                self.fallbacks.append(str(exc))
                logger.info("tool call cut: %s", exc)
        elif self._mode == "tool":
            self._close_block(self._buf, "", events=events)
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
            first_open, first_close = _first(buf, self._opens)[0], _first(buf, self._closes)[0]
            if first_open >= 0 and (first_close < 0 or first_open < first_close):  # nests
                nested = _nested_call(buf, 0, self._opens, self._closes, self._schemas, self._tolerant)
                if nested is not None:
                    self._buf, self._mode = buf[nested[1] :], "content"
                    events.append(ToolCallEvent(nested[0]))
                    self._run_start, self._ws_before_call = True, ""
                    return True
                if (not final or self._truncated) and _balanced_close(buf, 0, self._opens, self._closes)[
                    0
                ] < 0:
                    return False  # the balancing close may still come (or the limit cut the block)
            end, close_tag = _first(buf, self._closes)
            reopen = _first(buf, self._opens)[0] if self._tolerant else -1
            if reopen >= 0 and (end < 0 or reopen < end):  # a new block opens first: this one ends there
                self._buf, self._mode = buf[reopen:], "content"
                self._close_block(buf[:reopen], "", events=events)
                return True
            if end < 0:
                return False
            self._buf = buf[end + len(close_tag) :]
            self._mode = "content"
            self._close_block(buf[:end], close_tag, events=events)
            return True
        if self._mode == "reasoning":
            tags = (THINK_END, *self._opens) if self._calls_in_reasoning else (THINK_END,)
        else:
            tags = self._opens
        at, tag = _first(buf, tags)
        if at < 0:
            dropped = final and self._truncated and self._mode == "content"  # the start of an open tag
            keep = 0 if final and not dropped else max(_partial_suffix(buf, tag) for tag in tags)
            self._text(buf[: len(buf) - keep], events)
            self._buf = "" if dropped else buf[len(buf) - keep :]
            return False
        self._text(buf[:at], events)
        if self._mode == "reasoning":
            # `</think>` is consumed; a `<tool_call>` that ends the reasoning stays for content mode.
            self._buf = buf[at + len(tag) :] if tag == THINK_END else buf[at:]
            self._mode, self._ws, self._run_start = "content", "", True
        else:
            self._buf = buf[at + len(tag) :]
            self._mode, self._ws_before_call, self._ws, self._open_tag = "tool", self._ws, "", tag
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

    def _close_block(self, block: str, close_tag: str, *, events: list[StreamEvent]) -> None:
        """End the current block (`close_tag` "" when it was not closed) as a call or as text."""
        try:
            call = read_tool_call(block, self._schemas, tolerant=self._tolerant)
        except ToolCallError as exc:
            self.fallbacks.append(str(exc))
            logger.info("tool call left as text: %s", exc)
            self._mode = "content"
            self._text(self._ws_before_call + self._open_tag + block + close_tag, events)
        else:
            events.append(ToolCallEvent(call))
            self._run_start = True
        self._ws_before_call = ""


def collect(events: Sequence[StreamEvent]) -> tuple[str, str, list[ToolCall]]:
    """(reasoning, content, tool calls) joined from a stream of events."""
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    return reasoning, content, [e.call for e in events if isinstance(e, ToolCallEvent)]
