"""Scripted tiny models (`build-tiny --script`) behind the real `ninfer-serve`: real engine, parsers and SDKs.

Two models are built once for the module: `tool` thinks, says a sentence and calls `get_weather(city, days)`;
`malformed` calls a function with no parameters that no tool declares, so the block stays text. Servers run
with the model's own sampling defaults (temperature 1, top-k 20): the scripted logits lead by a margin that
sampling cannot overturn. A scripted model ignores the conversation, so the turn after a tool result calls
the tool again; the round trips check that each protocol accepts the result and renders it into the prompt.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from api_helpers import Server, free_port, start_server, stop_server

from engine.testing.script import Script, build_scripted

VENV_BIN = Path(sys.executable).parent
REASONING = "I should call the weather tool."
CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)
BAD_CALL = "<tool_call>\n<function=launch_rockets>\n</function>\n</tool_call>"
SCRIPTS = {
    "tool": Script(REASONING, "Let me check.\n\n" + CALL),
    "malformed": Script("Calling something.", "Launching.\n\n" + BAD_CALL),
}
ARGS = {"city": "Paris", "days": 3}
PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}}
RESPONSES_TOOL = {"type": "function", "name": "get_weather", "parameters": PARAMETERS}
ANTHROPIC_TOOL = {"name": "get_weather", "input_schema": PARAMETERS}


def _serve(root: Path, name: str) -> Server:
    # verify=False: these tests are the verification (the CLI test runs the build's own check)
    path = build_scripted(root / f"{name}.ninfer", SCRIPTS[name], verify=False)
    port = free_port()
    cmd = [
        str(VENV_BIN / "ninfer-serve"), str(path), "--port", str(port), "--max-context", "1024",
        "--max-concurrency", "2", "--default-max-tokens", "200", "--log-stats-interval-ms", "0",
    ]  # fmt: skip
    url, process = start_server(cmd, root / f"{name}.log", port)
    return Server(url, process, root / f"{name}.log")


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    root = tmp_path_factory.mktemp("scripted_model")
    started: dict[str, Server] = {}
    try:
        for name in SCRIPTS:
            started[name] = _serve(root, name)
        yield started
    finally:
        for server in started.values():
            stop_server(server.process)


@pytest.fixture(scope="module")
def oai(servers: dict[str, Server]) -> dict[str, openai.OpenAI]:
    return {n: openai.OpenAI(base_url=s.v1, api_key="unused", max_retries=0) for n, s in servers.items()}


@pytest.fixture(scope="module")
def claude(servers: dict[str, Server]) -> dict[str, anthropic.Anthropic]:
    return {
        n: anthropic.Anthropic(base_url=s.url, api_key="unused", max_retries=0) for n, s in servers.items()
    }


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


# --- Chat Completions ---------------------------------------------------------------------------------


def test_chat_reasoning_and_typed_tool_call(oai: dict[str, openai.OpenAI]) -> None:
    done = oai["tool"].chat.completions.create(
        model="ninfer-tiny-dense", messages=user("Weather in Paris?"), tools=[CHAT_TOOL]
    )
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.model_extra["reasoning_content"] == REASONING
    assert choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == ARGS


def test_chat_streamed_call_then_tool_result_round_trip(oai: dict[str, openai.OpenAI]) -> None:
    messages: list[Any] = [{"role": "system", "content": "You are helpful."}, *user("Weather in Paris?")]
    chunks = list(
        oai["tool"].chat.completions.create(
            model="ninfer-tiny-dense",
            messages=messages,
            tools=[CHAT_TOOL],
            stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == REASONING
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert calls[0].function.name == "get_weather" and calls[0].id
    arguments = "".join(tc.function.arguments or "" for tc in calls)
    assert json.loads(arguments) == ARGS
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    first_prompt = chunks[-1].usage.prompt_tokens
    messages += [
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": calls[0].id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments},
                },
            ],  # fmt: skip
        },
        {"role": "tool", "tool_call_id": calls[0].id, "content": '{"forecast": "sunny"}'},
    ]
    done = oai["tool"].chat.completions.create(
        model="ninfer-tiny-dense", messages=messages, tools=[CHAT_TOOL]
    )
    assert done.usage.prompt_tokens > first_prompt + 10  # the call and its result are in the prompt
    (again,) = done.choices[0].message.tool_calls
    assert json.loads(again.function.arguments) == ARGS


def test_chat_thinking_off_emits_content_only(oai: dict[str, openai.OpenAI]) -> None:
    done = oai["tool"].chat.completions.create(
        model="ninfer-tiny-dense", messages=user("Weather?"), tools=[CHAT_TOOL], reasoning_effort="none"
    )
    message = done.choices[0].message
    assert "reasoning_content" not in (message.model_extra or {})
    assert message.content == "Let me check." and json.loads(message.tool_calls[0].function.arguments) == ARGS


@pytest.mark.parametrize("stream", [False, True])
def test_chat_malformed_call_stays_text(oai: dict[str, openai.OpenAI], stream: bool) -> None:
    kwargs: dict[str, Any] = {"model": "ninfer-tiny-dense", "messages": user("Go."), "tools": [CHAT_TOOL]}
    if stream:
        chunks = list(oai["malformed"].chat.completions.create(**kwargs, stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        content = "".join(d.content or "" for d in deltas)
        assert not any(d.tool_calls for d in deltas)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    else:
        done = oai["malformed"].chat.completions.create(**kwargs)
        content, finish = done.choices[0].message.content, done.choices[0].finish_reason
        assert not done.choices[0].message.tool_calls
    assert finish == "stop" and content == "Launching.\n\n" + BAD_CALL


# --- Responses ----------------------------------------------------------------------------------------


def test_responses_function_call_then_output(oai: dict[str, openai.OpenAI]) -> None:
    first = oai["tool"].responses.create(model="ninfer-tiny-dense", input="Weather?", tools=[RESPONSES_TOOL])
    assert [item.type for item in first.output] == ["reasoning", "message", "function_call"]
    assert first.output[0].content[0].text == REASONING
    assert first.output_text == "Let me check."
    call = first.output[2]
    assert call.name == "get_weather" and json.loads(call.arguments) == ARGS
    second = oai["tool"].responses.create(
        model="ninfer-tiny-dense",
        input=[
            {"role": "user", "content": "Weather?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
        ],
        tools=[RESPONSES_TOOL],
    )
    assert second.status == "completed" and second.usage.input_tokens > first.usage.input_tokens
    assert json.loads(next(i for i in second.output if i.type == "function_call").arguments) == ARGS


def test_responses_streamed_call_events(oai: dict[str, openai.OpenAI]) -> None:
    events = list(
        oai["tool"].responses.create(
            model="ninfer-tiny-dense", input="x", tools=[RESPONSES_TOOL], stream=True
        )
    )
    types = [e.type for e in events]
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert reasoning == REASONING
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and json.loads(done[0].arguments) == ARGS
    assert types[-1] == "response.completed"


def test_responses_streamed_malformed_call_stays_text(oai: dict[str, openai.OpenAI]) -> None:
    events = list(
        oai["malformed"].responses.create(
            model="ninfer-tiny-dense", input="Go.", tools=[RESPONSES_TOOL], stream=True
        )
    )
    assert events[-1].type == "response.completed"
    assert not any(e.type.startswith("response.function_call") for e in events)
    response = events[-1].response
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output_text == "Launching.\n\n" + BAD_CALL


# --- Anthropic Messages -------------------------------------------------------------------------------


def test_anthropic_thinking_and_tool_use_round_trip(claude: dict[str, anthropic.Anthropic]) -> None:
    messages: list[Any] = user("Weather in Paris?")
    first = claude["tool"].messages.create(
        model="m", max_tokens=300, messages=messages, tools=[ANTHROPIC_TOOL], thinking={"type": "adaptive"}
    )
    assert [b.type for b in first.content] == ["thinking", "text", "tool_use"]
    assert first.content[0].thinking == REASONING and first.content[1].text == "Let me check."
    tool_use = first.content[2]
    assert tool_use.name == "get_weather" and tool_use.input == ARGS
    assert first.stop_reason == "tool_use"
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "sunny"}],
        },
    ]
    with claude["tool"].messages.stream(
        model="m", max_tokens=300, messages=messages, tools=[ANTHROPIC_TOOL], thinking={"type": "adaptive"}
    ) as stream:
        second = stream.get_final_message()
    usage = second.usage
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) > first.usage.input_tokens
    assert second.stop_reason == "tool_use" and second.content[-1].input == ARGS


def test_anthropic_streamed_thinking_disabled(claude: dict[str, anthropic.Anthropic]) -> None:
    with claude["tool"].messages.stream(
        model="m", max_tokens=300, messages=user("Weather?"), tools=[ANTHROPIC_TOOL],
        thinking={"type": "disabled"},
    ) as stream:  # fmt: skip
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Let me check."
    assert [b.type for b in final.content] == ["text", "tool_use"] and final.content[1].input == ARGS


def test_anthropic_malformed_call_stays_text(claude: dict[str, anthropic.Anthropic]) -> None:
    message = claude["malformed"].messages.create(
        model="m", max_tokens=300, messages=user("Go."), tools=[ANTHROPIC_TOOL], thinking={"type": "adaptive"}
    )
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[1].text == "Launching.\n\n" + BAD_CALL and message.stop_reason == "end_turn"
