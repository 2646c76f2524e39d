"""Local `$ref`s into `$defs` (pydantic's nested models and enums) are followed where a value's type decides
how it is written and read: the tool-call grammar (raw text for strings, JSON otherwise) and the parser that
types the call's arguments back."""

from __future__ import annotations

from engine.chat.parse import parse_tool_call
from engine.structured import ToolDef, tool_call_spec
from engine.structured.schema import resolved

PET = {
    "type": "object",
    "properties": {"kind": {"$ref": "#/$defs/Kind"}, "age": {"type": "integer"}},
    "required": ["kind", "age"],
    "additionalProperties": False,
}
OWNER = {
    "$defs": {"Kind": {"enum": ["cat", "dog"], "type": "string"}, "Pet": PET},
    "type": "object",
    "properties": {
        "best": {"$ref": "#/$defs/Pet"},
        "kind": {"$ref": "#/$defs/Kind", "description": "favourite"},
        "other": {"anyOf": [{"$ref": "#/$defs/Pet"}, {"type": "null"}]},
        "missing": {"$ref": "#/$defs/Nope"},
    },
    "required": ["best", "kind", "other"],
}


def test_resolved_follows_refs_keeps_siblings_and_leaves_unknown_refs():
    assert resolved(OWNER["properties"]["kind"], OWNER) == {
        "enum": ["cat", "dog"], "type": "string", "description": "favourite",
    }  # fmt: skip
    other = resolved(OWNER["properties"]["other"], OWNER)
    assert other["anyOf"][0]["properties"]["kind"] == {"$ref": "#/$defs/Kind"}  # deeper refs stay refs
    assert other["anyOf"][1] == {"type": "null"}
    assert resolved(OWNER["properties"]["missing"], OWNER) == {"$ref": "#/$defs/Nope"}


def test_a_call_with_ref_typed_parameters_parses_to_objects_and_raw_strings():
    block = (
        '\n<function=adopt>\n<parameter=best>\n{"kind": "cat", "age": 3}\n</parameter>\n'
        "<parameter=kind>\ndog\n</parameter>\n<parameter=other>\nnull\n</parameter>\n</function>\n"
    )
    call = parse_tool_call(block, {"adopt": OWNER})
    assert call.arguments == {"best": {"kind": "cat", "age": 3}, "kind": "dog", "other": None}


def test_the_tool_grammar_writes_a_ref_typed_enum_as_raw_text_and_a_ref_typed_model_as_json():
    grammar = tool_call_spec([ToolDef("adopt", OWNER, strict=True)], parallel=False, forced=True).grammar
    kind_rule = next(line for line in grammar.splitlines() if line.startswith("v0_1:"))
    assert kind_rule == 'v0_1: ("cat" | "dog") "\\n</parameter>\\n"'  # raw, as the template writes strings
    best_rule = next(line for line in grammar.splitlines() if line.startswith("v0_0:"))
    assert best_rule.startswith("v0_0: %json") and '"$defs"' in best_rule
