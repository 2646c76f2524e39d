"""Parsing generated text: reasoning split, typed Qwen XML tool calls, fallbacks to text, and a
streaming parser that gives the same result under any chunking and never shows tool-call markup."""

from __future__ import annotations

import random
from typing import Any

import pytest

from engine.chat import qwen35, render_chat_template
from engine.chat.parse import (
    ContentDelta,
    ParsedOutput,
    StreamingParser,
    ToolCall,
    ToolCallEvent,
    coerce_value,
    collect,
    parse_output,
    prompt_ends_in_reasoning,
)

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "integer"},
                    "score": {"type": "number"},
                    "exact": {"type": "boolean"},
                    "filters": {"type": "object"},
                    "tags": {"type": "array"},
                    "mode": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                    "cutoff": {"type": ["number", "null"]},
                },
            },
        },
    },
    {"name": "get_time", "input_schema": {"type": "object", "properties": {"tz": {"type": "string"}}}},
]


def call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


TZ = "<parameter=tz>\nUTC\n</parameter>\n"
DRIFTED = [  # each is get_time(tz=UTC) once repaired
    f"<tool_calls>\n<function=get_time>\n{TZ}</function>\n</tool_calls>",
    f"<toolcall>\n<function=get_time>\n{TZ}</function>\n</tool_call>",
    f"<function_call>\n<function=get_time>\n{TZ}</function>\n</function_call>",
    f"<tool_call>\n<function=get_time>\n{TZ}</tool_call>",
    "<tool_call>\nfunction=get_time>\nparameter=tz>\nUTC\n/parameter>\n/function>\n</tool_call>",
    "<tool_call>\n<<function=get_time>\n<<parameter=tz>\nUTC\n<</parameter>\n</function>\n</tool_call>",
    f"<tool_call>\n<|im_start|>assistant\n<function=get_time>\n{TZ}</function>\n<|im_end|></tool_call>",
    f"<tool_call>\n<=get_time>\n{TZ}</function>\n</tool_call>",
    f"<tool_call>\n<get_time>\n{TZ}</get_time>\n</tool_call>",
    f"<tool_call>\n<function=get_time>\n{TZ}</function>\n<tool_call>\n<function=get_time>\n{TZ}</function>\n</tool_call>",
]


def test_reasoning_then_content_when_prompt_opened_think() -> None:
    parsed = parse_output("Let me think.\nStill thinking.\n</think>\n\nThe answer is 4.", in_reasoning=True)
    assert parsed == ParsedOutput("Let me think.\nStill thinking.", "The answer is 4.", (), ())


def test_explicit_think_tags_and_no_reasoning() -> None:
    assert parse_output("<think>\nhmm\n</think>\n\nHi") == ParsedOutput("hmm", "Hi", (), ())
    assert parse_output("Just an answer.") == ParsedOutput(None, "Just an answer.", (), ())
    assert parse_output("no </think> here").content == "no </think> here"


def test_unfinished_reasoning_is_all_reasoning() -> None:
    assert parse_output("thinking and then cut off\n", in_reasoning=True) == ParsedOutput(
        "thinking and then cut off", "", (), ()
    )


def test_prompt_ends_in_reasoning() -> None:
    template = qwen35.qwen35_chat_template()
    messages = [{"role": "user", "content": "q"}]
    assert prompt_ends_in_reasoning(render_chat_template(template, messages))
    assert not prompt_ends_in_reasoning(render_chat_template(template, messages, enable_thinking=False))


def test_typed_tool_call() -> None:
    text = "Searching now.\n\n" + call(
        "search",
        query="  42  ",
        limit="5",
        score="0.5",
        exact="TRUE",
        filters='{"lang": "fr", "year": [2020, 2021]}',
        tags='["a", "b"]',
        mode="null",
        cutoff="1e-3",
    )
    parsed = parse_output(text, TOOLS)
    assert parsed.content == "Searching now."
    assert parsed.fallbacks == ()
    assert parsed.tool_calls == (
        ToolCall(
            "search",
            {
                "query": "  42  ",
                "limit": 5,
                "score": 0.5,
                "exact": True,
                "filters": {"lang": "fr", "year": [2020, 2021]},
                "tags": ["a", "b"],
                "mode": None,
                "cutoff": 0.001,
            },
        ),
    )
    assert parsed.tool_calls[0].arguments_json.startswith('{"query": "  42  ", "limit": 5')


@pytest.mark.parametrize(
    ("raw", "schema", "expected"),
    [
        ("hello\nworld", {"type": "string"}, "hello\nworld"),
        ("true", {"type": "string"}, "true"),
        ("False", {"type": "boolean"}, False),
        ("yes", {"type": "boolean"}, "yes"),  # mismatch, not JSON: kept as a string
        ("7", {"type": "integer"}, 7),
        ("7.5", {"type": "integer"}, 7.5),  # mismatch but valid JSON: kept typed
        ("seven", {"type": "integer"}, "seven"),
        ("[1,2]", {"type": "object"}, [1, 2]),
        ("3", {"type": ["string", "integer"]}, 3),
        ("abc", {"type": ["string", "integer"]}, "abc"),
        ("{}", {}, "{}"),  # no declared type: a string
        ("5", None, "5"),  # undeclared parameter: a string
    ],
)
def test_coerce_value(raw: str, schema: Any, expected: Any) -> None:
    value = coerce_value(raw, schema)
    assert value == expected and type(value) is type(expected)


def test_empty_non_string_is_omitted_and_empty_string_kept() -> None:
    parsed = parse_output(call("search", limit="", query=""), TOOLS)
    assert parsed.tool_calls == (ToolCall("search", {"query": ""}),)


def test_several_calls_and_anthropic_style_tool() -> None:
    text = call("get_time", tz="UTC") + "\n" + call("search", query="x")
    parsed = parse_output(text, TOOLS)
    assert parsed.tool_calls == (ToolCall("get_time", {"tz": "UTC"}), ToolCall("search", {"query": "x"}))
    assert parsed.content == ""


def test_missing_final_close_tag_is_still_a_call() -> None:
    text = "ok\n" + call("get_time", tz="CET").removesuffix("</tool_call>")
    parsed = parse_output(text, TOOLS)
    assert parsed.tool_calls == (ToolCall("get_time", {"tz": "CET"}),) and parsed.content == "ok"


@pytest.mark.parametrize(
    ("block", "reason"),
    [
        (call("delete_everything", path="/"), "undeclared tool 'delete_everything'"),
        ("<tool_call>\n<function=search>\n<parameter=query>\na\n</parameter>\n<parameter=query>\nb\n</parameter>\n</function>\n</tool_call>", "duplicate parameter 'query'"),
        ('<tool_call>\n{"name": "search", "arguments": {}}\n</tool_call>', "no <function=NAME>"),
        ("<tool_call>\n<function=search>\nstray words\n</function>\n</tool_call>", "unexpected text"),
        ("<tool_call>\n<function=>\n</function>\n</tool_call>", "empty function name"),
        ("<tool_call>\n<function=search>\n<parameter=query>\nx\n</parameter>\n", "no <function=NAME>"),
    ],
)  # fmt: skip
def test_malformed_calls_fall_back_to_text(block: str, reason: str) -> None:
    text = "Before.\n\n" + block
    parsed = parse_output(text, TOOLS)
    assert parsed.tool_calls == ()
    assert parsed.content == text.rstrip()
    assert len(parsed.fallbacks) == 1 and reason in parsed.fallbacks[0]


def test_call_before_end_of_thinking_is_recovered_when_tolerant() -> None:
    text = "I need the time.\n\n" + call("get_time", tz="UTC")
    strict = parse_output(text, TOOLS, in_reasoning=True)
    assert strict.reasoning == text.strip() and strict.tool_calls == ()
    tolerant = parse_output(text, TOOLS, in_reasoning=True, calls_in_reasoning=True)
    assert tolerant == ParsedOutput("I need the time.", "", (ToolCall("get_time", {"tz": "UTC"}),), ())


@pytest.mark.parametrize("block", DRIFTED)
def test_drifted_calls_are_recovered_only_when_tolerant(block: str) -> None:
    text = f"Sure.\n\n{block}\n\nDone."
    strict = parse_output(text, TOOLS)
    assert strict.tool_calls == ()  # strict: left as text
    tolerant = parse_output(text, TOOLS, tolerant=True)
    assert tolerant.tool_calls and all(c == ToolCall("get_time", {"tz": "UTC"}) for c in tolerant.tool_calls)
    assert tolerant.fallbacks == () and tolerant.content == "Sure.Done."


def test_tolerant_unparseable_block_stays_text_with_the_strict_reason() -> None:
    text = "<toolcall>\n<function=delete_everything>\n</function>\n</toolcall>"
    parsed = parse_output(text, TOOLS, tolerant=True)
    assert parsed.tool_calls == () and parsed.content == text
    assert parsed.fallbacks == ("undeclared tool 'delete_everything'",)


def test_tolerant_streaming_never_shows_partial_drifted_markup() -> None:
    text = "Checking.\n\n" + DRIFTED[1]
    parser = StreamingParser(TOOLS, tolerant=True)
    shown, events = "", []
    for ch in text:
        new = parser.feed(ch)
        events += new
        shown += "".join(e.text for e in new if isinstance(e, ContentDelta))
        assert "<" not in shown
    events += parser.finish()
    assert shown == "Checking." and collect(events)[2] == [ToolCall("get_time", {"tz": "UTC"})]


def test_without_tools_every_call_is_text() -> None:
    text = call("search", query="x")
    assert parse_output(text).content == text
    assert parse_output(text).fallbacks == ("undeclared tool 'search'",)


def test_one_bad_block_does_not_spoil_the_good_one() -> None:
    bad = call("nope")
    text = "Intro\n" + bad + "\n" + call("get_time", tz="UTC")
    parsed = parse_output(text, TOOLS)
    assert parsed.tool_calls == (ToolCall("get_time", {"tz": "UTC"}),)
    assert parsed.content == "Intro\n" + bad


def test_parsed_turn_renders_back_to_the_generated_text() -> None:
    """Whitespace follows the template: a parsed assistant turn re-renders byte for byte."""
    template = qwen35.qwen35_chat_template()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Time in UTC?"}]
    prompt = render_chat_template(template, messages, tools=TOOLS)
    generated = "Need the clock.\n</think>\n\nLet me check.\n\n" + call("get_time", tz="UTC")
    parsed = parse_output(generated, TOOLS, in_reasoning=prompt_ends_in_reasoning(prompt))
    turn = {
        "role": "assistant",
        "content": parsed.content,
        "reasoning_content": parsed.reasoning,
        "tool_calls": [{"function": {"name": c.name, "arguments": c.arguments}} for c in parsed.tool_calls],
    }
    rerendered = render_chat_template(template, [*messages, turn], tools=TOOLS, add_generation_prompt=False)
    assert rerendered == prompt + generated + "<|im_end|>\n"


# -- nesting: tool-call markup inside a parameter value ---------------------------------------------

INNER = call("get_time", tz="UTC")
NESTED_CALL = call("search", query=f"How to call it:\n{INNER}\nend")
CLOSE_IN_VALUE = call("search", query="a </parameter> b", mode="m")


def test_a_value_holding_a_whole_tool_call_stays_one_call() -> None:
    parsed = parse_output("Sure.\n\n" + NESTED_CALL + "\n\nDone.", TOOLS)
    assert parsed.tool_calls == (ToolCall("search", {"query": f"How to call it:\n{INNER}\nend"}),)
    assert (parsed.content, parsed.fallbacks) == ("Sure.Done.", ())


def test_a_value_holding_a_closing_parameter_tag_stays_one_call() -> None:
    parsed = parse_output(CLOSE_IN_VALUE, TOOLS)
    assert parsed.tool_calls == (ToolCall("search", {"query": "a </parameter> b", "mode": "m"}),)
    assert parsed.content == ""


def test_an_unbalanced_open_tag_in_a_value_falls_back_to_the_first_close() -> None:
    text = call("search", query="mentions <tool_call> once") + "\n" + call("get_time", tz="UTC")
    parsed = parse_output(text, TOOLS)
    assert parsed.tool_calls == (
        ToolCall("search", {"query": "mentions <tool_call> once"}),
        ToolCall("get_time", {"tz": "UTC"}),
    )


# -- streaming -------------------------------------------------------------------------------------

SAMPLES: list[tuple[str, bool]] = [
    ("Let me think.\n\nStep 2 <b>.\n</think>\n\nThe answer is 4.\n", True),
    ("<think>\nhmm </thin k\n</think>\n\nHi <tool_ca there", False),
    ("   plain answer with < and <tool and </think> inside  \n", False),
    (
        "plan\n</think>\n\nCalling.\n\n"
        + call("search", query="a b", limit="3")
        + "\n"
        + call("get_time", tz="UTC"),
        True,
    ),
    ("x</think>" + call("get_time", tz="UTC") + "\n\ntrailing words", True),
    ("Intro\n \n" + call("nope", a="1") + "\n\n" + call("get_time", tz="UTC") + " \n", False),
    ("ok\n" + call("get_time", tz="CET").removesuffix("</tool_call>"), False),
    ("ok \n<tool_call>\n<function=get_time>\n<parameter=tz>\nUT", False),
    ("never closes the reasoning <tool_call> inside\n\n", True),
    ("I will call it.\n" + call("get_time", tz="UTC") + "\n</think>\n\nafter", True),
    ("", True),
    ("\n\n", False),
    *((f"Sure.\n\n{block}\n\nDone.", False) for block in DRIFTED),
    ("a <tool_calls>\n<function=get_time>\n</function>\n</toolcall> b <tool_cal", False),
    (
        "x\n"
        + call("nope")
        + "\n"
        + call("get_time", tz="UTC").removesuffix("</tool_call>")
        + " \n"
        + call("search", query="q"),
        False,
    ),
    ("<tool_call>\n<function=nope>\n \n<tool_call> \n<tool_call>\n<function=nope>\n\n", False),
    ("think <toolcall>\n<function=get_time>\n</function>\n</toolcall> more", True),
    *((f"Writing docs.\n\n{block}\n\nDone.", False) for block in (NESTED_CALL, CLOSE_IN_VALUE)),
    ("x " + NESTED_CALL.removesuffix("</tool_call>") + " tail <tool_call>", False),
    (
        "a <tool_call>\n<function=nope>\n<tool_call>\n</tool_call>\n</tool_call> b "
        + call("get_time", tz="X"),
        False,
    ),
]


def _chunks(text: str, rng: random.Random) -> list[str]:
    out, i = [], 0
    while i < len(text):
        n = rng.randint(1, 6)
        out.append(text[i : i + n])
        i += n
    return out


@pytest.mark.parametrize("truncated", [False, True])
@pytest.mark.parametrize("tolerant", [False, True])
@pytest.mark.parametrize(("text", "in_reasoning"), SAMPLES)
def test_streaming_equals_non_streaming(
    text: str, in_reasoning: bool, tolerant: bool, truncated: bool
) -> None:
    expected = parse_output(
        text,
        TOOLS,
        in_reasoning=in_reasoning,
        calls_in_reasoning=tolerant,
        tolerant=tolerant,
        truncated=truncated,
    )
    rng = random.Random(len(text))
    chunkings = [[text], list(text), *(_chunks(text, rng) for _ in range(20))]
    for chunks in chunkings:
        parser = StreamingParser(
            TOOLS, in_reasoning=in_reasoning, calls_in_reasoning=tolerant, tolerant=tolerant
        )
        events = [e for chunk in chunks for e in parser.feed(chunk)] + parser.finish(truncated=truncated)
        reasoning, content, calls = collect(events)
        assert reasoning == (expected.reasoning or "")
        assert content == expected.content
        assert tuple(calls) == expected.tool_calls
        assert tuple(parser.fallbacks) == expected.fallbacks


def test_streaming_never_shows_partial_tool_markup() -> None:
    text = "Checking now.\n\n" + call("search", query="x")
    parser = StreamingParser(TOOLS)
    shown, events = "", []
    for ch in text:
        new = parser.feed(ch)
        events += new
        shown += "".join(e.text for e in new if isinstance(e, ContentDelta))
        assert "<" not in shown and "\n" not in shown
    events += parser.finish()
    assert shown == "Checking now."
    assert collect(events)[2] == [ToolCall("search", {"query": "x"})]
    assert isinstance(events[-1], ToolCallEvent)


def test_streaming_emits_reasoning_before_the_end_tag_arrives() -> None:
    parser = StreamingParser(in_reasoning=True)
    reasoning, _, _ = collect(parser.feed("Thinking about it"))
    assert reasoning == "Thinking about it"
    reasoning, content, _ = collect(parser.feed(" more</think>\n\nDone"))
    assert (reasoning, content) == (" more", "Done")


@pytest.mark.parametrize(
    ("pieces", "inside"),
    [
        (["Let me check.\n\n<tool_c"], True),  # a held prefix of the open tag
        (["<tool_c"], True),  # the same as the very first output (a forced call, thinking off)
        (["<"], True),  # may still open a call (or <think>)
        (["Let me check.\n\n<tool_call>\n<function=get_we"], True),  # in the block
        (["<tool_call>\n<function=f>\n</function>\n</tool_call>", "\n\nDone"], False),  # after it
        (["Let me check."], False),
        (["  \n"], False),  # nothing decided yet, but nothing that opens a call either
    ],
)
def test_in_tool_call_tells_markup_from_the_answer(pieces: list[str], inside: bool) -> None:
    parser = StreamingParser([{"type": "function", "function": {"name": "f", "parameters": {}}}])
    for piece in pieces:
        parser.feed(piece)
    assert parser.in_tool_call() is inside


# -- calls the output limit cut ----------------------------------------------------------------------

WHOLE = call("search", query='say "hi"\nthere', limit="12", filters='{"a": [1, 2]}', exact="true")
WHOLE_ARGS = {"query": 'say "hi"\nthere', "limit": 12, "filters": {"a": [1, 2]}, "exact": True}


@pytest.mark.parametrize("tolerant", [False, True])
def test_a_call_cut_anywhere_is_never_text(tolerant: bool) -> None:
    """Every cut of `Sure.` + a call: the answer's text is "Sure." and nothing of the markup; before the
    name arrived there is no call, after it a cut call whose arguments are those whose values arrived whole
    and whose JSON text is a prefix of the whole call's; once only `</tool_call>` is missing the call is
    whole. Streamed (char by char) equals parsed."""
    text = "Sure.\n\n" + WHOLE
    whole_json = ToolCall("search", WHOLE_ARGS).arguments_json
    named = text.index("<function=search>") + len("<function=search>")
    for cut in range(len("Sure."), len(text) + 1):
        head = text[:cut]
        parsed = parse_output(head, TOOLS, truncated=True, tolerant=tolerant)
        parser = StreamingParser(TOOLS, tolerant=tolerant)
        events = [e for ch in head for e in parser.feed(ch)] + parser.finish(truncated=True)
        assert collect(events) == ("", parsed.content, list(parsed.tool_calls)), cut
        assert parsed.content == "Sure.", cut
        if cut < named:
            assert parsed.tool_calls == (), cut
            continue
        (got,) = parsed.tool_calls
        assert got.name == "search" and whole_json.startswith(got.arguments_json), (cut, got)
        assert all(WHOLE_ARGS[k] == v for k, v in got.arguments.items()), (cut, got)
        if cut >= text.index("</function>") + len("</function>"):
            assert got == ToolCall("search", WHOLE_ARGS), cut


def test_cut_call_shapes() -> None:
    head = "<tool_call>\n<function=search>\n<parameter=limit>\n12\n</parameter>\n<parameter=query>\nsay hi\n</par"
    (got,) = parse_output(head, TOOLS, truncated=True).tool_calls
    assert got == ToolCall("search", {"limit": 12}, partial_json='{"limit": 12, "query": "say hi')
    assert got.arguments_json == '{"limit": 12, "query": "say hi'
    (got,) = parse_output("<tool_call>\n<function=search>\n", TOOLS, truncated=True).tool_calls
    assert got.arguments_json == "{" and got.arguments == {}
    unknown = parse_output("a <tool_call>\n<function=nope>\n<parameter=x>\n1", TOOLS, truncated=True)
    assert (unknown.content, unknown.tool_calls) == ("a", ())
    assert unknown.fallbacks == ("cut by the output limit: undeclared tool 'nope' (dropped)",)
    held = parse_output("a <tool_ca", TOOLS, truncated=True)  # the start of an open tag is not text
    assert held.content == "a" and parse_output("a <tool_ca", TOOLS).content == "a <tool_ca"
