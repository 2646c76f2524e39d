"""Checking a JSON schema before it is compiled: what can be constrained, and bounds on its size.

Owns: `check_schema`, a walk over every subschema that refuses, with the JSON-pointer path of the
offending node, what the grammar compiler cannot honour or would spend unbounded time on: keywords
llguidance does not implement (refused under `strict`, ignored otherwise), nesting past
`MAX_DEPTH`, enums past `MAX_ENUM`, more than `MAX_PROPERTIES` properties, schemas over
`MAX_SCHEMA_BYTES`, unknown `type` names, and `$ref`s that do not point inside the schema, and (under `strict`) string formats it cannot enforce.
Must not touch: requests, HTTP. The API turns `StructuredError` into its protocol's 400.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

MAX_DEPTH = 32  # nested subschemas
MAX_ENUM = 1024  # values in one enum
MAX_PROPERTIES = 5000  # object properties across the whole schema
MAX_SCHEMA_BYTES = 256 * 1024  # the schema as compact JSON

# Keywords that constrain values but that llguidance's JSON compiler does not implement.
UNSUPPORTED = frozenset({
    "not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies", "propertyNames",
    "contains", "minContains", "maxContains", "uniqueItems", "unevaluatedProperties", "unevaluatedItems",
    "$dynamicRef", "$recursiveRef",
})  # fmt: skip
# The string formats llguidance's JSON compiler enforces (any other `format` is refused under `strict`).
FORMATS = frozenset({
    "date-time", "date", "time", "duration", "email", "hostname", "ipv4", "ipv6", "uuid", "uri",
})  # fmt: skip
TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_ONE = ("additionalProperties", "items", "additionalItems", "not", "if", "then", "else", "contains")
_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


class StructuredError(ValueError):
    """A constraint that cannot be compiled; `param` is the request field, `path` a JSON pointer inside it."""

    def __init__(self, param: str, path: str, message: str) -> None:
        self.param, self.path, self.reason = param, path, message
        where = param if path in ("", "#") else f"{param} at {path}"
        super().__init__(f"{where}: {message}")


def _pointer(parts: Sequence[str]) -> str:
    return "#" + "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


_MISSING = object()


def _lookup(root: Mapping[str, Any], ref: str) -> Any:
    """The node a local `$ref` (a JSON pointer such as `#/$defs/Pet`) points at, or `_MISSING`."""
    if not ref.startswith("#"):
        return _MISSING
    node: Any = root
    for raw in ref[1:].split("/")[1:] if ref != "#" else ():
        key = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return _MISSING
    return node


def _resolve(root: Mapping[str, Any], ref: str) -> bool:
    return _lookup(root, ref) is not _MISSING


def resolved(node: Any, root: Mapping[str, Any], depth: int = 0) -> Any:
    """`node` with its local `$ref` followed (the node's other keywords kept beside the target's), and each
    `anyOf` / `oneOf` option followed likewise: what a value's type is, seen through `$defs` (pydantic puts
    nested models there). Refs deeper inside stay refs; a ref that does not resolve is left as it is."""
    for _ in range(MAX_DEPTH):
        ref = node.get("$ref") if isinstance(node, Mapping) else None
        target = _lookup(root, ref) if isinstance(ref, str) else _MISSING
        if not isinstance(target, Mapping):
            break
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    if isinstance(node, Mapping) and depth < MAX_DEPTH:
        for key in ("anyOf", "oneOf"):
            if isinstance(node.get(key), list):
                node = {**node, key: [resolved(option, root, depth + 1) for option in node[key]]}
    return node


class _Walk:
    def __init__(
        self, param: str, root: Mapping[str, Any], strict: bool, regex_error: Callable[[str], str] | None
    ):
        self.param, self.root, self.strict, self.regex_error = param, root, strict, regex_error
        self.properties = 0

    def fail(self, parts: Sequence[str], message: str) -> StructuredError:
        return StructuredError(self.param, _pointer(parts), message)

    def node(self, schema: Any, parts: list[str], depth: int = 0) -> None:
        if isinstance(schema, bool):
            return
        if not isinstance(schema, Mapping):
            raise self.fail(parts, f"a schema must be an object or a boolean, not {type(schema).__name__}")
        if depth > MAX_DEPTH:
            raise self.fail(parts, f"the schema nests deeper than {MAX_DEPTH} levels")
        self.keywords(schema, parts)
        for key in _MAPS:
            children = schema.get(key)
            if isinstance(children, Mapping):
                if key == "properties":
                    self.properties += len(children)
                    if self.properties > MAX_PROPERTIES:
                        raise self.fail(
                            [*parts, key], f"the schema has more than {MAX_PROPERTIES} properties"
                        )
                for name, child in children.items():
                    self.node(child, [*parts, key, str(name)], depth + 1)
            elif key in schema:
                raise self.fail([*parts, key], f"'{key}' must be an object")
        for key in _ONE:
            if key in schema and not isinstance(schema[key], list):
                self.node(schema[key], [*parts, key], depth + 1)
        for key in (*_LISTS, "items"):
            children = schema.get(key)
            if isinstance(children, list):
                for i, child in enumerate(children):
                    self.node(child, [*parts, key, str(i)], depth + 1)
            elif key in _LISTS and key in schema:
                raise self.fail([*parts, key], f"'{key}' must be a list of schemas")

    def keywords(self, schema: Mapping[str, Any], parts: list[str]) -> None:
        if self.strict:
            for key in schema:
                if key in UNSUPPORTED:
                    raise self.fail(
                        [*parts, key], f"the keyword '{key}' is not supported for structured outputs"
                    )
        kind = schema.get("type")
        kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
        for k in kinds:
            if k not in TYPES:
                raise self.fail([*parts, "type"], f"unknown type {k!r}")
        enum = schema.get("enum")
        if enum is not None and (not isinstance(enum, list) or not enum):
            raise self.fail([*parts, "enum"], "'enum' must be a non-empty list")
        if isinstance(enum, list) and len(enum) > MAX_ENUM:
            raise self.fail(
                [*parts, "enum"], f"the enum has {len(enum)} values; at most {MAX_ENUM} are supported"
            )
        ref = schema.get("$ref")
        if ref is not None and (not isinstance(ref, str) or not _resolve(self.root, ref)):
            raise self.fail([*parts, "$ref"], f"$ref {ref!r} does not point inside this schema")
        fmt = schema.get("format")
        if self.strict and fmt is not None and fmt not in FORMATS:
            raise self.fail(
                [*parts, "format"],
                f"the format {fmt!r} cannot be enforced (supported: {', '.join(sorted(FORMATS))})",
            )
        pattern = schema.get("pattern")
        if pattern is not None:
            if not isinstance(pattern, str):
                raise self.fail([*parts, "pattern"], "'pattern' must be a string")
            error = self.regex_error(pattern) if self.regex_error is not None else ""
            if error:
                raise self.fail(
                    [*parts, "pattern"], f"unsupported pattern {pattern!r}: {error.splitlines()[-1]}"
                )


def check_schema(
    schema: Any,
    *,
    param: str,
    strict: bool,
    regex_error: Callable[[str], str] | None = None,
) -> None:
    """Raise `StructuredError` naming the path of the first node that cannot be constrained.

    regex_error(pattern) -> "" when the grammar engine accepts the pattern, else its message.
    """
    if not isinstance(schema, Mapping):
        raise StructuredError(param, "#", "the schema must be a JSON object")
    try:
        size = len(json.dumps(schema, separators=(",", ":")))
    except (TypeError, ValueError) as exc:
        raise StructuredError(param, "#", f"the schema is not JSON: {exc}") from None
    if size > MAX_SCHEMA_BYTES:
        raise StructuredError(
            param, "#", f"the schema is {size} bytes; at most {MAX_SCHEMA_BYTES} are supported"
        )
    _Walk(param, schema, strict, regex_error).node(schema, [])


def check_name(name: Any, *, param: str) -> str:
    """A tool or parameter name that the XML tool-call format can carry (no `<`, `>` or newline)."""
    if not isinstance(name, str) or not name or len(name) > 128 or any(c in name for c in "<>\n"):
        raise StructuredError(
            param, "", f"{name!r} is not a usable name (1-128 characters, no '<', '>' or newline)"
        )
    return name
