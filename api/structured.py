"""Request fields -> the output grammar (`StructuredSpec`), the same for the three protocols.

Owns: reading response formats (Chat `response_format`, Responses `text.format`, Anthropic
`output_config.format`), strict tools and the forcing tool choices into one spec, and turning a schema
the grammar cannot enforce into a 400 that names the field and the JSON-pointer path inside the schema.
Precedence when several apply: a forced tool choice (required / named / any / tool), then a response
format, then strict tools or `parallel_tool_calls=false` under `auto` (calls constrained when opened).
`check(engine, spec)` compiles the grammar off the event loop before the request takes a lane.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from api.errors import ApiError, invalid
from engine.structured import (
    StructuredError,
    StructuredSpec,
    ToolDef,
    check_name,
    check_schema,
    json_object_spec,
    json_schema_spec,
    tool_call_spec,
)
from engine.structured.schema import resolved
from engine.structured.spec import RAW_FORMATS, json_pattern_error, pattern_error


def bad_schema(exc: StructuredError) -> ApiError:
    return ApiError(400, "invalid_schema", str(exc), param=exc.param)


def json_format(fmt: Any, param: str, *, schema_key: str = "schema") -> StructuredSpec | None:
    """{type: text | json_object | json_schema, ...} -> a spec (None for text).

    Chat nests the schema (`json_schema: {name, schema, strict}`); Responses and Anthropic put `schema`
    (and `strict`) beside `type`; the caller passes the mapping that holds `schema`.
    """
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping):
        raise invalid("must be an object", param=param)
    kind = fmt.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return json_object_spec(what=param)
    if kind != "json_schema":
        raise invalid(
            f"unsupported format type {kind!r} (text, json_object, json_schema)", param=f"{param}.type"
        )
    holder, where = (
        (fmt.get("json_schema"), f"{param}.json_schema") if schema_key == "json_schema" else (fmt, param)
    )
    if not isinstance(holder, Mapping):
        raise invalid("json_schema must be an object", param=where)
    schema = holder.get("schema")
    strict = bool(holder.get("strict"))
    try:
        check_schema(schema, param=f"{where}.schema", strict=strict, regex_error=json_pattern_error)
        return json_schema_spec(schema, strict=strict, what=f"{where}.schema")  # type: ignore[arg-type]
    except StructuredError as exc:
        raise bad_schema(exc) from None


def tool_def(name: Any, parameters: Any, strict: bool, param: str) -> ToolDef:
    """One tool, its parameters schema checked (`param` names the tool in errors)."""
    try:
        check_name(name, param=f"{param}.name")
        schema = parameters if parameters is not None else {"type": "object", "properties": {}}
        check_schema(schema, param=f"{param}.parameters", strict=strict)
        found = schema.get("properties")
        properties: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        for prop, value in properties.items():
            check_name(prop, param=f"{param}.parameters.properties")
            if strict:
                _raw_format(value, schema, prop, param)
    except StructuredError as exc:
        raise bad_schema(exc) from None
    return ToolDef(name, schema, strict)


def _raw_format(value: Any, root: Mapping[str, Any], prop: str, param: str) -> None:
    """A strict tool's string parameter is written as raw text: its `format` and `pattern` must be ones a
    regex holds."""
    value = resolved(value, root)
    if not isinstance(value, Mapping) or value.get("type") != "string":
        return
    path = "#/properties/" + prop.replace("~", "~0").replace("/", "~1")
    fmt = value.get("format")
    if fmt is not None and fmt not in RAW_FORMATS:
        raise StructuredError(
            f"{param}.parameters", f"{path}/format", f"the format {fmt!r} cannot be enforced on a tool "
            f"parameter (written as raw text; supported: {', '.join(sorted(RAW_FORMATS))})",
        )  # fmt: skip
    pattern = value.get("pattern")
    error = pattern_error(pattern) if isinstance(pattern, str) else ""
    if error:
        raise StructuredError(
            f"{param}.parameters", f"{path}/pattern", f"unsupported pattern {pattern!r}: {error}"
        )


def tools_spec(
    tools: Sequence[ToolDef],
    *,
    forced: str | None,
    parallel: bool,
    param: str = "tool_choice",
) -> StructuredSpec | None:
    """forced: None (auto), "" (any tool must be called) or a tool name (that tool must be called)."""
    if not tools:
        if forced is not None:
            raise invalid("a forced tool choice needs tools", param=param)
        return None
    if forced:
        chosen = [t for t in tools if t.name == forced]
        if not chosen:
            raise invalid(f"tool {forced!r} is not among the request's tools", param=param)
        return tool_call_spec(chosen, parallel=False, forced=True, what=param)
    if forced == "":
        return tool_call_spec(tools, parallel=parallel, forced=True, what=param)
    if any(t.strict for t in tools) or not parallel:
        return tool_call_spec(tools, parallel=parallel, forced=False, what="tools")
    return None


def pick(*specs: StructuredSpec | None) -> StructuredSpec | None:
    """The first spec given (the module's precedence order)."""
    return next((s for s in specs if s is not None), None)


async def check(engine: Any, spec: StructuredSpec | None) -> None:
    """Compile `spec` for the served model (cached) or raise the 400 naming why it cannot be enforced."""
    grammars = getattr(engine, "grammars", None)
    if spec is None or grammars is None:
        return
    try:
        await asyncio.to_thread(grammars.check, spec)
    except StructuredError as exc:
        raise bad_schema(exc) from None
