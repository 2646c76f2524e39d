"""What a request's output must look like, as plain data: `StructuredSpec` and the grammars it carries.

Owns: building the llguidance Lark grammar for each constraint the APIs offer (a JSON schema, any JSON
object, Qwen XML tool calls whose parameters follow each tool's schema), and the phases around it.
Must not touch: tokenizers, matchers, tensors (engine/structured/compiler.py and matchers.py do). This
module imports nothing heavy: `engine.request` carries a `StructuredSpec` in `SamplingParams`.

Phases of one constrained generation (Qwen3.5 chat format):
  1. reasoning (`in_reasoning`: the prompt opened `<think>`): free text until the `</think>` token;
  2. spans constrained by `grammar`. Without a `trigger`, one span covers everything after the reasoning
     up to the end of the turn (response formats, `tool_choice` required / named). With a `trigger`
     (a special token such as `<tool_call>`), text is free and each sampled trigger token starts a span
     (the grammar covers what follows the trigger); after `max_spans` spans only the end of turn may follow.

Tool calls follow the chat template byte for byte:
  <tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call>
A VALUE is raw text for a string parameter (engine/chat/parse.py keeps it as is) and JSON otherwise;
raw text can never contain `</parameter>`. Values follow their schema for every tool; a tool that is not
`strict` has its schema compiled leniently (keywords the grammar cannot enforce are ignored, not refused).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.structured.schema import resolved

# JSON between tokens: flexible (models pretty-print) but bounded, so no generation runs away in blanks.
JSON_WHITESPACE = r"[\x20\x0A\x0D\x09]{0,24}"
LEAD = r"LEAD: /[ \n]{1,4}/"  # the blank line the template puts after `</think>`
_CLOSE = '"\\n</parameter>\\n"'  # what ends a parameter's value
# A raw value is lazy up to its closing tag (`suffix`): a greedy lexeme that may hold `\n</parameter` could
# never end at that tag. `raw_value` includes the tag; so does every value rule below.
_RAW_TEXT = 'RAW: /(?s:.*)/ & ~/(?s:.*)<\\/parameter>(?s:.*)/\nraw_value[suffix="\\n</parameter>\\n"]: RAW'
_NAME = "PNAME: /[^<>\\n]{1,128}/"  # a parameter name of a free-form (schema-less) tool


@dataclass(frozen=True, slots=True)
class StructuredSpec:
    """A request's output constraint. `grammar` is llguidance Lark text (hashable: the compile cache key)."""

    grammar: str
    strict: bool = True  # unsupported schema keywords are refused (False: ignored, best effort)
    in_reasoning: bool = False  # generation starts inside `<think>`: free until `</think>`
    trigger: str | None = None  # special token opening each span; None: one span after the reasoning
    max_spans: int | None = None  # with a trigger: after this many spans only the end of turn follows
    what: str = "response_format"  # the request field it came from (errors name it)


def _lark_str(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _json(schema: Mapping[str, Any], strict: bool) -> str:
    options: dict[str, Any] = {"whitespace_pattern": JSON_WHITESPACE}
    if not strict:
        options["lenient"] = True
    body = {**schema, "x-guidance": options}
    return "%json " + json.dumps(body, ensure_ascii=False)


def json_schema_spec(
    schema: Mapping[str, Any], *, strict: bool, what: str = "response_format"
) -> StructuredSpec:
    """The output is one JSON value valid against `schema` (after the reasoning)."""
    grammar = f"start: LEAD? body\nbody: {_json(schema, strict)}\n{LEAD}\n"
    return StructuredSpec(grammar, strict=strict, what=what)


def json_object_spec(what: str = "response_format") -> StructuredSpec:
    """The output is one JSON object (`response_format: {"type": "json_object"}`)."""
    return json_schema_spec({"type": "object"}, strict=False, what=what)


@dataclass(frozen=True, slots=True)
class ToolDef:
    """One callable tool: its name, its parameters schema, and whether the schema must hold (`strict`)."""

    name: str
    parameters: Mapping[str, Any]
    strict: bool


def _defs(root: Mapping[str, Any]) -> dict[str, Any]:
    return {k: root[k] for k in ("$defs", "definitions") if isinstance(root.get(k), Mapping)}


def _string_only(schema: Mapping[str, Any]) -> bool:
    """Raw text is right for this value: parse.py keeps it a string (no `$ref`, `string` among its types)."""
    kind = schema.get("type")
    types = {kind} if isinstance(kind, str) else set(kind) if isinstance(kind, list) else set()
    for key in ("anyOf", "oneOf"):
        for option in schema.get(key) or ():
            if isinstance(option, Mapping) and isinstance(option.get("type"), str):
                types.add(option["type"])
    constrained = any(k in schema for k in ("enum", "const", "pattern", "format", "minLength", "maxLength"))
    return "string" in types and "$ref" not in schema and not constrained


def _value_rule(name: str, schema: Any, root: Mapping[str, Any], strict: bool, rules: list[str]) -> str:
    schema = resolved(schema, root)  # a `$ref` to a string type is raw text too (engine/chat/parse.py agrees)
    """A rule for one parameter's value followed by its closing tag."""
    if not isinstance(schema, Mapping) or _string_only(schema):
        return "raw_value"
    kind = schema.get("type")
    if kind in ("string", None) and "$ref" not in schema:  # (an enum of strings needs no type: parse agrees)
        options = schema.get("enum", [schema["const"]] if "const" in schema else None)
        if isinstance(options, list) and options and all(isinstance(o, str) for o in options):
            rules.append(f"{name}: (" + " | ".join(_lark_str(o) for o in options) + f") {_CLOSE}")
            return name
        raw = _raw_string_terminal(schema, strict) if kind == "string" else None
        if raw is not None:  # raw text as the template writes strings, its length, pattern and format a regex
            terminal = name.upper()
            rules.append(f'{name}[suffix="\\n</parameter>\\n"]: {terminal}\n{terminal}: {raw}')
            return name
    rules.append(f"{name}: {_json({**schema, **_defs(root)}, strict)} {_CLOSE}")
    return name


# Formats a raw-text string parameter can be held to (llguidance regexes: each matches the whole value).
# engine/structured/schema.py refuses any other `format` on a strict tool's string parameter.
_DATE = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
_TIME = (
    r"([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]{1,9})?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
)
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
RAW_FORMATS: dict[str, str] = {
    "date-time": f"{_DATE}[Tt]{_TIME}",
    "date": _DATE,
    "time": _TIME,
    "email": rf"[A-Za-z0-9!#$%&'*+=?^_`{{|}}~-]+(\.[A-Za-z0-9!#$%&'*+=?^_`{{|}}~-]+)*@{_LABEL}(\.{_LABEL})+",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "uri": r"[A-Za-z][A-Za-z0-9+.-]*:[^\x00-\x20<>\x22{}|\\^`\x7f]*",
    "hostname": f"{_LABEL}(\\.{_LABEL})*",
    "ipv4": r"((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])",
}


def _lark_regex(pattern: str) -> str:
    """`pattern` as a Lark `/.../` literal: unescaped slashes and line breaks escaped."""
    out, escaped = [], False
    for char in pattern:
        if escaped:
            out.append(char)
            escaped = False
        elif char == "\\":
            out.append(char)
            escaped = True
        elif char == "/":
            out.append("\\/")
        elif char in "\n\r":
            out.append("\\n" if char == "\n" else "\\r")
        else:
            out.append(char)
    return "/" + "".join(out) + "/"


def search_regex(pattern: str) -> str:
    """A JSON-schema `pattern` (a search: it may match anywhere unless anchored with `^` / `$`) as a regex
    that matches the whole value, which is how llguidance's terminals match."""
    head = "" if pattern.startswith("^") else "(?s:.*)"
    tail = "" if pattern.endswith("$") and not pattern.endswith("\\$") else "(?s:.*)"
    return f"{head}(?:{pattern}){tail}"


def pattern_error(pattern: str) -> str:
    """ "" when llguidance can hold a raw value to the JSON-schema `pattern`, else its message."""
    return _regex_error(_lark_regex(search_regex(pattern)))


@functools.lru_cache(maxsize=1024)
def json_pattern_error(pattern: str) -> str:
    """ "" when llguidance's JSON compiler accepts the `pattern` of a JSON string, else its message."""
    import llguidance

    grammar = llguidance.LLMatcher.grammar_from_json_schema({"type": "string", "pattern": pattern})
    error = llguidance.LLMatcher.validate_grammar(grammar, None)
    return error.splitlines()[0] if error else ""


@functools.lru_cache(maxsize=1024)
def _regex_error(lark_regex: str) -> str:
    import llguidance  # (lazily: this module stays plain data for `engine.request`)

    grammar = llguidance.LLMatcher.grammar_from_lark(f"start: X\nX: {lark_regex}")
    error = llguidance.LLMatcher.validate_grammar(grammar, None)
    return error.splitlines()[0] if error else ""


def _raw_string_terminal(schema: Mapping[str, Any], strict: bool) -> str | None:
    """The terminal of a string parameter with minLength / maxLength / pattern / format (a raw value never
    holds `</parameter>`); None when nothing here constrains it. What a regex cannot hold is ignored when the
    tool is not strict (api/structured.py refuses it first, with its path, when it is)."""
    parts = []
    low, high = schema.get("minLength"), schema.get("maxLength")
    if isinstance(low, int) or isinstance(high, int):
        low = low if isinstance(low, int) and low > 0 else 0
        parts.append(f"/(?s:.{{{low},{high if isinstance(high, int) else ''}}})/")
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and (strict or not pattern_error(pattern)):
        parts.append(_lark_regex(search_regex(pattern)))
    fmt = RAW_FORMATS.get(schema.get("format"))  # type: ignore[arg-type]
    if fmt is not None:
        parts.append(_lark_regex(fmt))
    if not parts:
        return None
    return " & ".join([*parts, "~/(?s:.*)<\\/parameter>(?s:.*)/"])


def _parameters_rule(index: int, tool: ToolDef, rules: list[str]) -> str:
    """Rule for the parameter blocks of `tool`: declared ones in schema order, required ones mandatory."""
    schema = tool.parameters
    properties = schema.get("properties")
    if not isinstance(properties, Mapping) or not properties:
        closed = schema.get("additionalProperties") is False or tool.strict
        if closed:
            return '""'
        rules.append(f'free_params: ("<parameter=" PNAME ">\\n" raw_value)*\n{_NAME}')
        return "free_params"
    required = set(schema.get("required") or ())
    parts = []
    for j, (prop, prop_schema) in enumerate(properties.items()):
        value = _value_rule(f"v{index}_{j}", prop_schema, schema, tool.strict, rules)
        block = f'"<parameter=" {_lark_str(prop)} ">\\n" {value}'
        parts.append(block if prop in required else f"({block})?")
    rules.append(f"params{index}: " + " ".join(parts))
    return f"params{index}"


def _call_body(tools: Sequence[ToolDef], rules: list[str]) -> str:
    """`\\n<function=NAME>\\n PARAMS </function>\\n </tool_call>` for any of `tools` (after `<tool_call>`)."""
    options = []
    for i, tool in enumerate(tools):
        params = _parameters_rule(i, tool, rules)
        rules.append(f"fn{i}: {_lark_str(tool.name + '>' + chr(10))} {params}")
        options.append(f"fn{i}")
    return '"\\n<function=" (' + " | ".join(options) + ') "</function>\\n" </tool_call>'


def tool_call_spec(
    tools: Sequence[ToolDef], *, parallel: bool, forced: bool, what: str = "tool_choice"
) -> StructuredSpec:
    """Tool calls in Qwen's XML format, each parameter following its tool's schema where `strict`.

    forced: the answer is tool calls only (`tool_choice` required / named / any / tool): at least one,
    exactly one unless `parallel`. Otherwise (strict tools under `auto`) text is free and each call the
    model opens is constrained; without `parallel`, at most one call.
    """
    if not tools:
        raise ValueError("tool_call_spec needs at least one tool")
    rules: list[str] = []
    body = _call_body(tools, rules)
    strict = all(tool.strict for tool in tools)
    lines = [*rules, _RAW_TEXT]
    if forced:
        more = ' ("\\n" call)*' if parallel else ""
        head = [f"start: LEAD? call{more}", f"call: <tool_call> {body}", LEAD]
        return StructuredSpec("\n".join([*head, *lines]) + "\n", strict=strict, what=what)
    grammar = "\n".join([f"start: {body}", *lines]) + "\n"
    return StructuredSpec(
        grammar, strict=strict, trigger="<tool_call>", max_spans=None if parallel else 1, what=what
    )
