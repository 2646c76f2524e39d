"""Grammar-constrained decoding (llguidance): output specs, schema checks, compiled grammars, matchers.

`spec` (plain data, imported by `engine.request`), `schema` (checks with JSON-pointer errors),
`compiler` (the tokenizer-bound compile cache), `matchers` (per-request state and the batch bitmask;
engine/sampling.py applies it). The API builds specs; the engine enforces them.
"""

from engine.structured.schema import StructuredError, check_name, check_schema
from engine.structured.spec import StructuredSpec, ToolDef, json_object_spec, json_schema_spec, tool_call_spec

__all__ = [
    "StructuredError",
    "StructuredSpec",
    "ToolDef",
    "check_name",
    "check_schema",
    "json_object_spec",
    "json_schema_spec",
    "tool_call_spec",
]
