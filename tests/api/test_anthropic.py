"""Anthropic Messages through the official `anthropic` SDK: scripted thinking / tools / stops, real engine."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest
from api_helpers import API_KEY, Server

WEATHER_TOOL: dict[str, Any] = {
    "name": "get_weather",
    "description": "Weather forecast for a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def client(scripted_server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=scripted_server.url, api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def real(real_server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=real_server.url, api_key="unused", max_retries=0)


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


def test_without_thinking_the_answer_is_the_first_block(client: anthropic.Anthropic) -> None:
    message = client.messages.create(model="any-label", max_tokens=200, messages=user("[[plain]] hi"))
    assert message.content[0].text == "Hello! I am a scripted model."  # type: ignore[union-attr]
    assert [b.type for b in message.content] == ["text"]  # `thinking` missing means off on this route


def test_message_has_thinking_and_text_blocks(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model="any-label", max_tokens=200, messages=user("[[plain]] hi"), thinking={"type": "adaptive"}
    )
    assert message.model == "any-label"
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == "The user greets me."
    assert message.content[1].text == "Hello! I am a scripted model."
    assert message.stop_reason == "end_turn"
    assert message.usage.output_tokens > 0 and message.usage.input_tokens > 0


def test_stream_accumulates_to_the_same_message(client: anthropic.Anthropic) -> None:
    with client.messages.stream(
        model="m", max_tokens=200, messages=user("[[plain]] hi"), thinking={"type": "adaptive"}
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Hello! I am a scripted model."
    assert final.content[0].type == "thinking" and final.content[0].thinking == "The user greets me."
    assert final.stop_reason == "end_turn"


def test_thinking_disabled_gives_no_thinking_block(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model="m", max_tokens=200, messages=user("[[plain]] hi"), thinking={"type": "disabled"}
    )
    assert [b.type for b in message.content] == ["text"]


def test_tool_use_round_trip_reports_cache_reads(client: anthropic.Anthropic) -> None:
    messages: list[Any] = user("[[tool]] weather in Paris?")
    with client.messages.stream(
        model="m", max_tokens=300, system="Be brief.", messages=messages, tools=[WEATHER_TOOL]
    ) as stream:
        first = stream.get_final_message()
    assert first.stop_reason == "tool_use"
    tool_use = next(b for b in first.content if b.type == "tool_use")
    assert tool_use.name == "get_weather" and tool_use.input == {"city": "Paris", "days": 3}
    assert tool_use.id.startswith("toolu_")
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "sunny"}],
        },
    ]
    second = client.messages.create(
        model="m", max_tokens=300, system="Be brief.", messages=messages, tools=[WEATHER_TOOL]
    )
    assert second.content[-1].text == "It will be sunny in Paris."
    assert second.usage.cache_read_input_tokens > 0


def test_stop_sequences(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model="m", max_tokens=200, messages=user("[[stop]] count"), stop_sequences=["STOP"]
    )
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "STOP"
    assert message.content[-1].text == "one two"


def test_final_assistant_message_is_a_prefill(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model="m",
        max_tokens=200,
        messages=[*user("[[plain]] hi"), {"role": "assistant", "content": "Sure:"}],
    )
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == "Hello! I am a scripted model."


def test_count_tokens_matches_the_prompt(client: anthropic.Anthropic) -> None:
    body: dict[str, Any] = {
        "model": "m",
        "messages": user("[[plain]] count me"),
        "system": "sys",
        "tools": [WEATHER_TOOL],
    }
    counted = client.messages.count_tokens(**body)
    message = client.messages.create(max_tokens=50, **body)
    assert counted.input_tokens == message.usage.input_tokens + message.usage.cache_read_input_tokens


def test_bad_thinking_budget_is_an_anthropic_400(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(
            model="m", max_tokens=2000, messages=user("hi"), thinking={"type": "enabled", "budget_tokens": 10}
        )
    assert info.value.body["type"] == "error"
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert "budget_tokens" in info.value.body["error"]["message"]


def test_a_message_thread_is_refused_as_the_sdk_expects(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        client.beta.messages.create(
            model="m",
            max_tokens=50,
            messages=user("hi"),
            betas=["message-threads-2026-08-12"],
            extra_body={"thread": {"type": "create"}},
        )
    error = info.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error"
    assert error["details"] == {"error_code": "thread_unsupported_request"}


def test_max_tokens_zero_is_rejected(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="m", max_tokens=0, messages=user("hi"))


def test_real_engine_message_and_cache_read_on_second_turn(real: anthropic.Anthropic) -> None:
    first = real.messages.create(
        model="m", max_tokens=3, system="Anthropic test.", messages=user("First question?")
    )
    assert first.stop_reason == "max_tokens" and first.usage.output_tokens == 3
    text = "".join(getattr(b, "text", "") for b in first.content) or "ok"
    with real.messages.stream(
        model="m",
        max_tokens=3,
        system="Anthropic test.",
        messages=[*user("First question?"), {"role": "assistant", "content": text}, *user("Second?")],
    ) as stream:
        second = stream.get_final_message()
    assert second.usage.output_tokens == 3
    assert second.usage.cache_read_input_tokens > 0
