"""A scripted server with `--tolerant-tool-calls`: drifted tool-call markup becomes a call (streamed and
not); and Anthropic `thinking.budget_tokens` reaches the engine, which cuts the reasoning at the budget and
closes it with `</think>` before the answer (real server and SDKs; the scripted engine imitates the
scheduler's budget, tests/engine/test_thinking_budget.py runs the real one)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from api_helpers import HERE, Server, free_port, start_server, stop_server
from scripted import SCRIPTS

FULL_REASONING = SCRIPTS["overthink"][0].strip()
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        },
    },
}
ASK = [{"role": "user", "content": "[[overthink]] what is it?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root: Path = tmp_path_factory.mktemp("budget_server")
    port = free_port()
    cmd = [
        sys.executable, str(HERE / "scripted_server.py"),
        "--port", str(port),
        "--max-context", "8192",
        "--tolerant-tool-calls",
    ]  # fmt: skip
    url, process = start_server(cmd, root / "server.log", port)
    yield Server(url, process, root / "server.log")
    stop_server(process)


def test_drifted_tool_call_is_recovered_streamed_and_not(server: Server) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    kwargs: dict[str, Any] = dict(
        model="ninfer-tiny-dense",
        messages=[{"role": "user", "content": "[[drifted]] weather?"}],
        tools=[WEATHER_TOOL],
    )
    whole = client.chat.completions.create(**kwargs)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    calls = choice.message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [  # type: ignore[union-attr]
        ("get_weather", {"city": "Paris", "days": 3})
    ]
    content, arguments, shown = "", "", []
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is not None and delta.content:
            content += delta.content
            shown.append(delta.content)
        for call in (delta.tool_calls if delta is not None else None) or []:
            arguments += (call.function.arguments or "") if call.function else ""
    assert content == "Checking." and "<" not in "".join(shown)
    assert json.loads(arguments) == {"city": "Paris", "days": 3}
    message = _client(server).messages.create(
        model="m",
        max_tokens=500,
        messages=[{"role": "user", "content": "[[drifted]] weather?"}],
        tools=[{"name": "get_weather", "input_schema": WEATHER_TOOL["function"]["parameters"]}],
    )
    assert message.stop_reason == "tool_use"
    assert [b.type for b in message.content] == ["text", "tool_use"]  # no `thinking`: thinking off
    assert message.content[1].input == {"city": "Paris", "days": 3}  # type: ignore[union-attr]


def _client(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def test_reasoning_past_the_budget_is_cut_and_the_answer_follows(server: Server) -> None:
    client = _client(server)
    message = client.messages.create(
        model="m", max_tokens=4000, messages=ASK, thinking={"type": "enabled", "budget_tokens": 1024}
    )
    assert [b.type for b in message.content] == ["thinking", "text"]
    thinking, text = message.content[0].thinking, message.content[1].text  # type: ignore[union-attr]
    assert text == "Final answer." and message.stop_reason == "end_turn"
    assert FULL_REASONING.startswith(thinking) and len(thinking) < len(FULL_REASONING)
    count = client.messages.count_tokens(model="m", messages=[{"role": "user", "content": thinking}])
    empty = client.messages.count_tokens(model="m", messages=[{"role": "user", "content": ""}])
    assert count.input_tokens - empty.input_tokens <= 1024
    # output = the budget, the injected "\n</think>\n\n" and the answer (+ end of turn)
    assert 1024 < message.usage.output_tokens < 1024 + 12


def test_streamed_and_non_streamed_agree(server: Server) -> None:
    client = _client(server)
    kwargs = dict(
        model="m", max_tokens=4000, messages=ASK, thinking={"type": "enabled", "budget_tokens": 1100}
    )
    whole = client.messages.create(**kwargs)  # type: ignore[call-overload]
    with client.messages.stream(**kwargs) as stream:  # type: ignore[arg-type]
        streamed = stream.get_final_message()
    assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in whole.content]
    assert streamed.usage.output_tokens == whole.usage.output_tokens


def test_without_a_budget_the_reasoning_runs_to_its_end(server: Server) -> None:
    message = _client(server).messages.create(
        model="m", max_tokens=4000, messages=ASK, thinking={"type": "adaptive"}
    )
    assert message.content[0].thinking == FULL_REASONING  # type: ignore[union-attr]
    assert message.content[1].text == "Final answer."  # type: ignore[union-attr]
