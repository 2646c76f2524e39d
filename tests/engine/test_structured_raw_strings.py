"""String parameters of strict tools are raw text (as the chat template writes them), held to their
`minLength` / `maxLength` / `pattern` / `format` by llguidance regexes, and read back as the same string."""

from __future__ import annotations

import pytest

from engine.chat.parse import parse_tool_call
from engine.structured import ToolDef, tool_call_spec
from engine.structured.compiler import GrammarCompiler
from engine.structured.schema import StructuredError, check_schema
from engine.structured.spec import RAW_FORMATS, search_regex
from engine.tokenizer import qwen35_tokenizer

VOCAB = 248320
VALID = {
    "date-time": ("2026-12-03T21:45:00Z", "2026-12-03 21:45"),
    "date": ("2026-02-28", "2026-13-01"),
    "time": ("23:59:59.5+01:00", "24:00:00Z"),
    "email": ("ada.lovelace@example.org", "ada@"),
    "uuid": ("123e4567-e89b-12d3-a456-426614174000", "123e4567-e89b-12d3-a456"),
    "uri": ("https://example.org/a/b?c=d", "no scheme here"),
    "hostname": ("api.example-1.org", "-bad-.org"),
    "ipv4": ("192.168.0.255", "256.1.1.1"),
}


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    return GrammarCompiler(qwen35_tokenizer(), VOCAB)


def _accepts(compiler: GrammarCompiler, schema: dict, value: str) -> bool:
    tool = ToolDef("f", {"type": "object", "properties": {"s": schema}, "required": ["s"]}, strict=True)
    spec = tool_call_spec([tool], parallel=False, forced=True)
    compiler.check(spec)
    text = f"<tool_call>\n<function=f>\n<parameter=s>\n{value}\n</parameter>\n</function>\n</tool_call>"
    matcher = compiler.matcher(spec)
    return bool(matcher.consume_tokens(compiler.tokenizer.encode(text))) and matcher.is_accepting()


@pytest.mark.parametrize("fmt", sorted(RAW_FORMATS))
def test_each_format_holds_a_raw_value_to_it(compiler, fmt):
    good, bad = VALID[fmt]
    assert _accepts(compiler, {"type": "string", "format": fmt}, good)
    assert not _accepts(compiler, {"type": "string", "format": fmt}, bad)


def test_patterns_search_unless_anchored_and_lengths_bound_the_raw_value(compiler):
    anchored = {"type": "string", "pattern": "^[A-Z]{3}-[0-9]+$"}
    assert _accepts(compiler, anchored, "ABC-12") and not _accepts(compiler, anchored, "xABC-12")
    loose = {"type": "string", "pattern": "x/y"}  # JSON Schema patterns search; a slash needs no escape
    assert _accepts(compiler, loose, "a x/y b") and not _accepts(compiler, loose, "a x-y b")
    short = {"type": "string", "minLength": 2, "maxLength": 4, "pattern": "^a"}
    assert _accepts(compiler, short, "ab\nc") and not _accepts(compiler, short, "abcde")
    assert not _accepts(compiler, short, "ba")
    assert search_regex("^a$") == "(?:^a$)" and search_regex("a\\$") == "(?s:.*)(?:a\\$)(?s:.*)"


def test_a_plain_string_value_ends_at_its_closing_tag_and_an_untyped_string_enum_is_raw(compiler):
    """The raw value is lazy up to `\\n</parameter>\\n`: a greedy one could never close (it may hold
    `\\n</parameter`), so every strict tool with a free string parameter ran to max_tokens."""
    assert _accepts(compiler, {"type": "string"}, "two\nlines </param")
    assert _accepts(compiler, {"enum": ["on", "off"]}, "on") and not _accepts(
        compiler, {"enum": ["on"]}, '"on"'
    )


def test_a_raw_value_parses_back_as_the_same_string_without_quotes():
    schema = {"type": "object", "properties": {"when": {"type": "string", "format": "date"}}}
    block = "\n<function=book>\n<parameter=when>\n2026-12-03\n</parameter>\n</function>\n"
    assert parse_tool_call(block, {"book": schema}).arguments == {"when": "2026-12-03"}


def test_strict_schemas_refuse_formats_nothing_enforces_with_their_path():
    schema = {"type": "object", "properties": {"a": {"type": "string", "format": "uri-reference"}}}
    with pytest.raises(StructuredError) as info:
        check_schema(schema, param="response_format", strict=True)
    assert info.value.path == "#/properties/a/format" and "uri-reference" in str(info.value)
    check_schema(schema, param="response_format", strict=False)  # ignored when not strict


def test_a_pattern_no_regex_holds_is_ignored_for_a_tool_that_is_not_strict(compiler):
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "(?=a)b", "maxLength": 3}}}
    lenient = tool_call_spec([ToolDef("f", schema, strict=False)], parallel=False, forced=True)
    compiler.check(lenient)  # the length still holds; the lookahead is dropped
    assert "(?=a)" not in lenient.grammar and ".{0,3}" in lenient.grammar
    strict = tool_call_spec([ToolDef("f", schema, strict=True)], parallel=False, forced=True)
    with pytest.raises(StructuredError):
        compiler.check(strict)  # (api/structured.py refuses it earlier, naming #/properties/s/pattern)
