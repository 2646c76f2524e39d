"""Structured outputs through real HTTP and the official SDKs, on the random-weight demo model: every answer is
valid against its schema because the grammar, not the model, guarantees it. Response formats and the parse
helpers on the three APIs, strict tools, each forcing tool_choice, parallel_tool_calls=false, and 400s that name
the schema path in each protocol's error shape.

Schemas bound every value (enums, integer ranges, short strings) so a random model finishes within max_tokens.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any, Literal

import anthropic
import httpx
import jsonschema
import openai
import pytest
from api_helpers import VENV_BIN, Server, free_port, start_server, stop_server
from pydantic import BaseModel, Field

from api.errors import ApiError
from api.structured import json_format

MAX_TOKENS = 400
MODEL = "ninfer-tiny-dense"
NO_THINKING: dict[str, Any] = {"chat_template_kwargs": {"enable_thinking": False}}
OFF: Any = {"type": "disabled"}  # Anthropic: the random model would reason until max_tokens


class Pet(BaseModel):
    kind: Literal["cat", "dog", "fish"]
    age: int = Field(ge=0, le=30)
    indoor: bool
    name: str = Field(max_length=6)


class Verdict(
    BaseModel
):  # finite values only: the Anthropic SDK moves numeric and length bounds into descriptions
    kind: Literal["cat", "dog", "fish"]
    indoor: bool


class Forecast(BaseModel):
    days: int = Field(ge=1, le=9)
    unit: Literal["celsius", "fahrenheit"]


class Owner(BaseModel):  # nested models: pydantic writes them into `$defs` and points at them with `$ref`
    name: str = Field(max_length=6)
    best: Verdict
    pets: list[Verdict] = Field(max_length=2)
    forecast: Forecast | None


FORECAST_PARAMS = {**Forecast.model_json_schema(), "additionalProperties": False}
TOOL: dict[str, Any] = {
    "type": "function",
    "function": {"name": "forecast", "description": "Weather", "parameters": FORECAST_PARAMS, "strict": True},
}
OTHER: dict[str, Any] = {
    "type": "function",
    "function": {"name": "other", "parameters": {"type": "object", "properties": {"x": {"type": "boolean"}}}},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("structured_server")
    port = free_port()
    cmd = [
        str(VENV_BIN / "ninfer-serve"),
        "--port",
        str(port),
        "--max-context",
        "2048",
        "--max-concurrency",
        "4",
    ]
    url, process = start_server(cmd, root / "server.log", port)
    yield Server(url, process, root / "server.log")
    stop_server(process)


@pytest.fixture(scope="module")
def oa(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def an(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=300)


def ask(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


def test_chat_parse_returns_a_schema_valid_object(oa: openai.OpenAI) -> None:
    done = oa.chat.completions.parse(
        model=MODEL,
        messages=ask("A pet?"),
        response_format=Pet,
        max_tokens=MAX_TOKENS,
        extra_body=NO_THINKING,
    )
    choice = done.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert isinstance(choice.message.parsed, Pet)


def test_chat_json_object_and_streamed_json_schema(oa: openai.OpenAI) -> None:
    done = oa.chat.completions.create(
        model=MODEL,
        messages=ask("JSON please"),
        response_format={"type": "json_object"},
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body=NO_THINKING,
    )
    text = done.choices[0].message.content or ""
    assert done.choices[0].finish_reason == "stop", text
    assert isinstance(json.loads(text), dict)
    schema = {**Pet.model_json_schema(), "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "pet", "schema": schema, "strict": True}}
    stream = oa.chat.completions.create(
        model=MODEL, messages=ask("pet"), response_format=fmt, max_tokens=MAX_TOKENS, stream=True, extra_body=NO_THINKING
    )  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), schema)


def test_responses_parse_with_text_format(oa: openai.OpenAI) -> None:
    done = oa.responses.parse(
        model=MODEL,
        input="A pet?",
        text_format=Pet,
        max_output_tokens=MAX_TOKENS,
        reasoning={"effort": "none"},
    )
    assert isinstance(done.output_parsed, Pet)


def test_nested_models_through_defs_parse_on_chat_responses_and_as_a_tool(oa: openai.OpenAI) -> None:
    assert "$defs" in Owner.model_json_schema()
    chat = oa.chat.completions.parse(
        model=MODEL, messages=ask("An owner?"), response_format=Owner, max_tokens=MAX_TOKENS, extra_body=NO_THINKING
    )  # fmt: skip
    assert isinstance(chat.choices[0].message.parsed, Owner), chat.choices[0].message.content
    response = oa.responses.parse(
        model=MODEL, input="An owner?", text_format=Owner, max_output_tokens=MAX_TOKENS, reasoning={"effort": "none"}
    )  # fmt: skip
    assert isinstance(response.output_parsed, Owner)
    tool = oa.chat.completions.parse(
        model=MODEL, messages=ask("Register"), tools=[openai.pydantic_function_tool(Owner)], tool_choice="required",
        parallel_tool_calls=False, max_tokens=MAX_TOKENS, extra_body=NO_THINKING,
    )  # fmt: skip
    calls = tool.choices[0].message.tool_calls or []
    assert len(calls) == 1, tool.choices[0].message
    parsed = calls[0].function.parsed_arguments
    assert isinstance(parsed, Owner) and isinstance(parsed.best, Verdict), calls[0].function.arguments


def test_strict_tool_with_required_and_named_choice_gives_valid_arguments(oa: openai.OpenAI) -> None:
    for choice in ("required", {"type": "function", "function": {"name": "forecast"}}):
        done = oa.chat.completions.create(
            model=MODEL, messages=ask("Weather?"), tools=[TOOL, OTHER], tool_choice=choice,  # type: ignore[arg-type]
            max_tokens=MAX_TOKENS, temperature=0, extra_body=NO_THINKING,
        )  # fmt: skip
        message = done.choices[0].message
        assert done.choices[0].finish_reason == "tool_calls" and message.tool_calls, message
        call = message.tool_calls[0]
        if choice != "required":
            assert call.function.name == "forecast" and len(message.tool_calls) == 1
        if call.function.name == "forecast":
            Forecast.model_validate_json(call.function.arguments)


def test_pydantic_function_tool_parse_and_single_call_without_parallel(oa: openai.OpenAI) -> None:
    done = oa.chat.completions.parse(
        model=MODEL, messages=ask("Weather?"), tools=[openai.pydantic_function_tool(Forecast)],
        tool_choice="required", parallel_tool_calls=False, max_tokens=MAX_TOKENS, extra_body=NO_THINKING,
    )  # fmt: skip
    calls = done.choices[0].message.tool_calls or []
    assert len(calls) == 1 and isinstance(calls[0].function.parsed_arguments, Forecast)


def test_responses_strict_function_tool_with_required_choice(oa: openai.OpenAI) -> None:
    tool = {"type": "function", "name": "forecast", "parameters": FORECAST_PARAMS, "strict": True}
    done = oa.responses.create(
        model=MODEL, input="Weather?", tools=[tool], tool_choice="required",  # type: ignore[list-item]
        max_output_tokens=MAX_TOKENS, reasoning={"effort": "none"},
    )  # fmt: skip
    calls = [item for item in done.output if item.type == "function_call"]
    assert calls and calls[0].name == "forecast"
    Forecast.model_validate_json(calls[0].arguments)


def test_anthropic_output_config_format_and_messages_parse(an: anthropic.Anthropic) -> None:
    done = an.messages.parse(
        model=MODEL, max_tokens=MAX_TOKENS, messages=ask("A pet?"), output_format=Verdict, thinking=OFF
    )
    assert isinstance(done.parsed_output, Verdict), done.content


def test_anthropic_any_and_named_tool_choice_give_a_valid_tool_use(an: anthropic.Anthropic) -> None:
    tools: list[Any] = [
        {"name": "forecast", "description": "Weather", "input_schema": FORECAST_PARAMS, "strict": True},
        {"name": "other", "input_schema": {"type": "object", "properties": {"x": {"type": "boolean"}}}},
    ]
    for choice in ({"type": "any"}, {"type": "tool", "name": "forecast", "disable_parallel_tool_use": True}):
        done = an.messages.create(
            model=MODEL, max_tokens=MAX_TOKENS, messages=ask("Weather?"), tools=tools,
            tool_choice=choice, thinking=OFF,  # type: ignore[arg-type]
        )  # fmt: skip
        uses = [block for block in done.content if block.type == "tool_use"]
        assert done.stop_reason == "tool_use" and uses, done.content
        if choice["type"] == "tool":
            assert len(uses) == 1 and uses[0].name == "forecast"
        if uses[0].name == "forecast":
            Forecast.model_validate(uses[0].input)


BAD = {
    "type": "object",
    "properties": {"a": {"type": "array", "uniqueItems": True}},
    "additionalProperties": False,
}


def test_unenforceable_schemas_are_400s_naming_the_path_in_each_protocol(
    oa: openai.OpenAI, an: anthropic.Anthropic
) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": BAD, "strict": True}}
    with pytest.raises(openai.BadRequestError) as chat:
        oa.chat.completions.create(model=MODEL, messages=ask("x"), response_format=fmt)  # type: ignore[arg-type]
    assert chat.value.body["param"] == "response_format.json_schema.schema"  # type: ignore[index]
    assert "#/properties/a/uniqueItems" in chat.value.body["message"]  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as resp:
        oa.responses.create(
            model=MODEL, input="x", text={"format": {"type": "json_schema", "name": "x", "schema": BAD, "strict": True}}
        )  # fmt: skip
    assert resp.value.body["param"] == "text.format.schema"  # type: ignore[index]
    for prop, where in (
        ({"type": "string", "format": "ipv6"}, "format"),
        ({"type": "string", "pattern": "(?=a)b"}, "pattern"),
    ):
        tool = {
            "type": "function",
            "function": {
                "name": "f",
                "strict": True,
                "parameters": {
                    "type": "object",
                    "properties": {"s": prop},
                    "required": ["s"],
                    "additionalProperties": False,
                },
            },
        }
        with pytest.raises(openai.BadRequestError) as raw:
            oa.chat.completions.create(model=MODEL, messages=ask("x"), tools=[tool])  # type: ignore[list-item]
        assert raw.value.body["param"] == "tools[0].function.parameters"  # type: ignore[index]
        assert f"#/properties/s/{where}" in raw.value.body["message"]  # type: ignore[index]
    huge = {"type": "object", "properties": {"a": {"enum": [f"v{i}" for i in range(5000)]}}}
    with pytest.raises(anthropic.BadRequestError) as msg:
        an.messages.create(
            model=MODEL, max_tokens=10, messages=ask("x"),
            extra_body={"output_config": {"format": {"type": "json_schema", "schema": huge}}},
        )  # fmt: skip
    assert msg.value.body["type"] == "error"  # type: ignore[index]
    assert "#/properties/a/enum" in msg.value.body["error"]["message"]  # type: ignore[index]


def test_chat_logprobs_with_top_alternatives_streamed_and_not(oa: openai.OpenAI) -> None:
    fields: dict[str, Any] = dict(
        model=MODEL, messages=ask("Hi"), max_tokens=6, temperature=0, extra_body=NO_THINKING
    )
    done = oa.chat.completions.create(**fields, logprobs=True, top_logprobs=3)
    content = done.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == done.usage.completion_tokens == 6  # type: ignore[union-attr]
    for entry in content:
        tops = [t.logprob for t in entry.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and entry.logprob <= 0
        assert (
            entry.token == entry.top_logprobs[0].token and entry.logprob == tops[0]
        )  # greedy: the best token
    assert "".join(e.token for e in content) == done.choices[0].message.content
    plain = oa.chat.completions.create(**fields)
    assert plain.choices[0].logprobs is None
    stream = oa.chat.completions.create(**fields, logprobs=True, top_logprobs=1, stream=True)
    streamed = [
        e for c in stream if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content or ()
    ]
    assert [e.token for e in streamed] == [e.token for e in content]
    with pytest.raises(openai.BadRequestError) as info:
        oa.chat.completions.create(model=MODEL, messages=ask("Hi"), top_logprobs=2)
    assert info.value.body["param"] == "top_logprobs"  # type: ignore[index]


def test_responses_include_output_text_logprobs(oa: openai.OpenAI) -> None:
    done = oa.responses.create(
        model=MODEL, input="Hi", max_output_tokens=5, reasoning={"effort": "none"}, temperature=0,
        include=["message.output_text.logprobs"], top_logprobs=2,
    )  # fmt: skip
    part = next(item for item in done.output if item.type == "message").content[0]
    assert part.type == "output_text" and part.logprobs and len(part.logprobs) == 5
    assert all(len(lp.top_logprobs) == 2 for lp in part.logprobs)


def test_responses_stream_output_text_deltas_with_their_tokens_logprobs(oa: openai.OpenAI) -> None:
    stream = oa.responses.create(
        model=MODEL, input="Hi", max_output_tokens=6, reasoning={"effort": "none"}, temperature=0, stream=True,
        include=["message.output_text.logprobs"], top_logprobs=2,
    )  # fmt: skip
    events = list(stream)
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    done = next(e for e in events if e.type == "response.output_text.done")
    final = next(e for e in events if e.type == "response.incomplete").response
    part = next(item for item in final.output if item.type == "message").content[0]
    assert part.type == "output_text" and part.logprobs and len(part.logprobs) == 6
    streamed = [lp for d in deltas for lp in d.logprobs]
    assert streamed and [lp.token for lp in streamed] == [lp.token for lp in part.logprobs[: len(streamed)]]
    assert [lp.token for lp in done.logprobs] == [lp.token for lp in part.logprobs]
    assert "".join(lp.token for lp in done.logprobs) == done.text
    for lp in streamed:
        tops = lp.top_logprobs or []
        assert len(tops) == 2 and tops[0].token == lp.token and tops[0].logprob == lp.logprob  # greedy
    plain = oa.responses.create(
        model=MODEL, input="Hi", max_output_tokens=3, reasoning={"effort": "none"}, stream=True
    )
    assert all(not e.logprobs for e in plain if e.type == "response.output_text.delta")


def test_n_choices_share_the_prompt_and_each_follows_the_schema(oa: openai.OpenAI) -> None:
    done = oa.chat.completions.parse(
        model=MODEL, messages=ask("Pets?"), response_format=Pet, n=3, seed=7, temperature=1.0,
        max_tokens=MAX_TOKENS, extra_body=NO_THINKING,
    )  # fmt: skip
    assert [c.index for c in done.choices] == [0, 1, 2]
    assert all(isinstance(c.message.parsed, Pet) for c in done.choices)
    assert len({c.message.content for c in done.choices}) > 1  # seed + i: the choices differ
    usage = done.usage
    assert usage is not None and usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_n_choices_stream_each_with_its_index_finish_reason_logprobs_and_the_usage_last(
    oa: openai.OpenAI,
) -> None:
    schema = {**Pet.model_json_schema(), "additionalProperties": False}
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "pet", "schema": schema, "strict": True}}
    stream = oa.chat.completions.create(
        model=MODEL, messages=ask("Pets?"), response_format=fmt, n=3, seed=11, temperature=1.0, logprobs=True,
        max_tokens=MAX_TOKENS, stream=True, stream_options={"include_usage": True}, extra_body=NO_THINKING,
    )  # fmt: skip
    text, tokens, finish, roles = ["", "", ""], [0, 0, 0], {}, set()
    chunks = list(stream)
    for chunk in chunks[:-1]:
        assert chunk.usage is None and len(chunk.choices) == 1
        choice = chunk.choices[0]
        assert choice.index not in finish, "a choice sent a chunk after its finish"
        roles.update([choice.index] if choice.delta.role == "assistant" else [])
        text[choice.index] += choice.delta.content or ""
        tokens[choice.index] += len(choice.logprobs.content or ()) if choice.logprobs else 0
        if choice.finish_reason:
            finish[choice.index] = choice.finish_reason
    assert roles == {0, 1, 2} and finish == {0: "stop", 1: "stop", 2: "stop"}
    for answer in text:
        jsonschema.validate(json.loads(answer), schema)
    assert len(set(text)) > 1  # seed + i: the choices differ
    usage = chunks[-1].usage
    assert not chunks[-1].choices and usage is not None and all(tokens)
    assert sum(tokens) <= usage.completion_tokens <= sum(tokens) + 3  # (+ each choice's end-of-turn token)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_a_cut_n_choices_stream_aborts_every_choice(oa: openai.OpenAI, server: Server) -> None:
    stream = oa.chat.completions.create(
        model=MODEL, messages=ask("Talk for a long while"), n=3, max_tokens=1500, stream=True, extra_body=NO_THINKING
    )  # fmt: skip
    for read, _ in enumerate(stream):
        if read >= 6:
            break
    stream.close()
    deadline = time.monotonic() + 15  # (uncut, 3 x 1,500 tokens would run for minutes on the CPU)
    while httpx.get(f"{server.url}/stats", timeout=30).json()["engine"]["num_running"]:
        assert time.monotonic() < deadline, "a choice of the cut stream kept running"
        time.sleep(0.1)


def _prefix_hits(server: Server) -> int:
    def find(node: Any) -> int | None:
        if isinstance(node, dict):
            if "num_prefix_hits" in node:
                return int(node["num_prefix_hits"])
            return next((v for v in map(find, node.values()) if v is not None), None)
        return None

    hits = find(httpx.get(f"{server.url}/stats", timeout=30).json())
    assert hits is not None
    return hits


def test_n_choices_reuse_the_first_choices_prompt(oa: openai.OpenAI, server: Server) -> None:
    before = _prefix_hits(server)
    done = oa.chat.completions.create(
        model=MODEL, messages=ask("A prompt no other test sends"), n=4, max_tokens=3, extra_body=NO_THINKING
    )
    assert len(done.choices) == 4
    assert _prefix_hits(server) - before >= 3  # choices 1..3 started from choice 0's prompt


def test_a_response_format_pattern_the_grammar_cannot_compile_is_refused_with_its_path() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?=a)b"}}}
    for strict in (True, False):  # (llguidance cannot compile it leniently either)
        fmt = {"type": "json_schema", "json_schema": {"name": "x", "strict": strict, "schema": schema}}
        with pytest.raises(ApiError) as info:
            json_format(fmt, "response_format", schema_key="json_schema")
        assert info.value.status == 400 and "#/properties/a/pattern" in info.value.message
