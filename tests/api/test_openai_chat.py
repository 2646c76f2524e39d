"""Chat Completions through the official `openai` SDK: scripted reasoning / tools / stops, and the real engine."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from api_helpers import API_KEY, Server

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def client(scripted_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=scripted_server.v1, api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def real(real_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=real_server.v1, api_key="unused", max_retries=0)


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


def test_non_streaming_returns_reasoning_content_and_usage(client: openai.OpenAI) -> None:
    done = client.chat.completions.create(model="ninfer-tiny-dense", messages=user("[[plain]] hi"))
    message = done.choices[0].message
    assert message.content == "Hello! I am a scripted model."
    assert message.model_extra["reasoning_content"] == "The user greets me."
    assert done.choices[0].finish_reason == "stop"
    assert done.usage.prompt_tokens > 0 and done.usage.completion_tokens > 0
    assert done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens
    assert done.usage.completion_tokens_details.reasoning_tokens > 0


def test_streaming_deltas_join_to_the_message_and_usage_comes_last(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="ninfer-tiny-dense",
        messages=user("[[plain]] hi"),
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    reasoning = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks if c.choices
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert reasoning == "The user greets me."
    assert content == "Hello! I am a scripted model."
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_tool_call_is_parsed_with_typed_arguments(client: openai.OpenAI) -> None:
    done = client.chat.completions.create(
        model="ninfer-tiny-dense", messages=user("[[tool]] weather?"), tools=[WEATHER_TOOL]
    )
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}


def test_streamed_tool_call_and_round_trip_reports_cached_tokens(client: openai.OpenAI) -> None:
    messages: list[Any] = [
        {"role": "system", "content": "You are helpful."},
        *user("[[tool]] weather in Paris?"),
    ]
    chunks = list(
        client.chat.completions.create(
            model="ninfer-tiny-dense", messages=messages, tools=[WEATHER_TOOL], stream=True
        )
    )
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Paris", "days": 3}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    messages += [
        {
            "role": "assistant",
            "content": "Let me check.",
            "reasoning_content": "I should call the weather tool.",
            "tool_calls": [
                {
                    "id": calls[0].id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": calls[0].function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": calls[0].id, "content": '{"forecast": "sunny"}'},
    ]
    done = client.chat.completions.create(model="ninfer-tiny-dense", messages=messages, tools=[WEATHER_TOOL])
    assert done.choices[0].message.content == "It will be sunny in Paris."
    assert done.usage.prompt_tokens_details.cached_tokens > 0


def test_malformed_tool_call_stays_text(client: openai.OpenAI) -> None:
    done = client.chat.completions.create(
        model="ninfer-tiny-dense", messages=user("[[malformed]] go"), tools=[WEATHER_TOOL]
    )
    message = done.choices[0].message
    assert not message.tool_calls and done.choices[0].finish_reason == "stop"
    assert "<function=launch_rockets>" in message.content


def test_tool_choice_none_does_not_parse_calls(client: openai.OpenAI) -> None:
    done = client.chat.completions.create(
        model="ninfer-tiny-dense", messages=user("[[tool]] x"), tools=[WEATHER_TOOL], tool_choice="none"
    )
    assert not done.choices[0].message.tool_calls
    assert "<tool_call>" in done.choices[0].message.content


def test_stop_string_cuts_content(client: openai.OpenAI) -> None:
    done = client.chat.completions.create(
        model="ninfer-tiny-dense", messages=user("[[stop]] count"), stop=["STOP"]
    )
    assert done.choices[0].message.content == "one two"
    assert done.choices[0].finish_reason == "stop"


def test_reasoning_effort_none_disables_thinking(client: openai.OpenAI) -> None:
    done = client.chat.completions.create(
        model="ninfer-tiny-dense", messages=user("[[plain]] hi"), reasoning_effort="none"
    )
    assert done.choices[0].message.content == "Hello! I am a scripted model."
    assert "reasoning_content" not in (done.choices[0].message.model_extra or {})


def test_enable_thinking_false_in_chat_template_kwargs(client: openai.OpenAI) -> None:
    done = client.chat.completions.create(
        model="ninfer-tiny-dense",
        messages=user("[[plain]] hi"),
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert "reasoning_content" not in (done.choices[0].message.model_extra or {})


def test_max_tokens_limits_output_and_reports_length(client: openai.OpenAI) -> None:
    done = client.chat.completions.create(
        model="ninfer-tiny-dense", messages=user("[[long]] go"), max_completion_tokens=5
    )
    assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 5


# ---------------------------------------------------------------------------------------- real engine


def test_models_list_alias_and_lookup(real: openai.OpenAI) -> None:
    models = real.models.list().data
    assert [m.id for m in models] == ["tiny-alias"]
    assert models[0].model_extra["max_model_len"] == 384
    assert real.models.retrieve("ninfer-tiny-dense").id == "ninfer-tiny-dense"
    with pytest.raises(openai.NotFoundError) as info:
        real.models.retrieve("no-such-model")
    assert info.value.body["code"] == "model_not_found"


def test_real_engine_streams_and_second_turn_reports_cached_tokens(real: openai.OpenAI) -> None:
    first = real.chat.completions.create(
        model="tiny-alias",
        messages=[{"role": "system", "content": "You are terse."}, *user("Say something.")],
        max_tokens=4,
        temperature=0,
    )
    assert first.choices[0].finish_reason == "length" and first.usage.completion_tokens == 4
    history = [
        {"role": "system", "content": "You are terse."},
        *user("Say something."),
        {"role": "assistant", "content": first.choices[0].message.content or "ok"},
        *user("And again."),
    ]
    chunks = list(
        real.chat.completions.create(
            model="tiny-alias",
            messages=history,
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usage = chunks[-1].usage
    assert usage.completion_tokens == 3
    assert usage.prompt_tokens_details.cached_tokens > 0


def test_real_engine_context_length_exceeded(real: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        real.chat.completions.create(model="tiny-alias", messages=user("word " * 600), max_tokens=2)
    assert info.value.body["code"] == "context_length_exceeded"
    assert info.value.status_code == 400


def test_n_choices_waiting_for_a_lane_still_end_at_their_stop_string(real: openai.OpenAI) -> None:
    """Two lanes, three choices: choice 2 waits for a lane while choices 0 and 1 run before the stream can begin.
    Their stop strings are matched as they generate, so they end (and free a lane) after a few tokens, not
    after all of max_tokens (usage counted ~900 tokens for a few characters of text)."""
    stream = real.chat.completions.create(
        model="tiny-alias",
        messages=[{"role": "user", "content": "Name three animals."}],
        n=3,
        max_tokens=300,
        stop=["a", "e", "o", " "],
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    chunks = list(stream)
    finish = {
        c.choices[0].index: c.choices[0].finish_reason
        for c in chunks
        if c.choices and c.choices[0].finish_reason
    }
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens < 150, usage
    assert set(finish) == {0, 1, 2}
