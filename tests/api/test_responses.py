"""OpenAI Responses Core through the official `openai` SDK: items, semantic events, the store."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from api_helpers import API_KEY, Server

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather forecast for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
}


@pytest.fixture(scope="module")
def client(scripted_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=scripted_server.v1, api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def real(real_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=real_server.v1, api_key="unused", max_retries=0)


def test_response_has_reasoning_and_message_items(client: openai.OpenAI) -> None:
    response = client.responses.create(model="ninfer-tiny-dense", input="[[plain]] hi")
    assert response.status == "completed"
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output[0].content[0].text == "The user greets me."
    assert response.output_text == "Hello! I am a scripted model."
    assert response.usage.output_tokens_details.reasoning_tokens > 0
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens


def test_stream_events_are_ordered_and_end_with_one_terminal_event(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model="ninfer-tiny-dense", input="[[plain]] hi", stream=True))
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert "response.reasoning_text.delta" in types and "response.output_text.delta" in types
    assert "response.output_text.done" in types and "response.content_part.done" in types
    terminal = [t for t in types if t in ("response.completed", "response.incomplete", "response.failed")]
    assert terminal == ["response.completed"] and types[-1] == "response.completed"
    numbers = [e.sequence_number for e in events]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text == "Hello! I am a scripted model."


def test_function_call_then_output_with_previous_response_id(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model="ninfer-tiny-dense", input="[[tool]] weather?", tools=[WEATHER_TOOL]
    )
    call = next(item for item in first.output if item.type == "function_call")
    assert call.id.startswith("fc_") and call.call_id.startswith("call_")
    assert json.loads(call.arguments) == {"city": "Paris", "days": 3}
    stream = client.responses.create(
        model="ninfer-tiny-dense",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=[WEATHER_TOOL],
        stream=True,
    )
    final = [e for e in stream if e.type == "response.completed"][0].response
    assert final.output_text == "It will be sunny in Paris."
    assert final.previous_response_id == first.id
    assert final.usage.input_tokens_details.cached_tokens > 0


def test_streamed_function_call_events(client: openai.OpenAI) -> None:
    events = list(
        client.responses.create(
            model="ninfer-tiny-dense", input="[[tool]] x", tools=[WEATHER_TOOL], stream=True
        )
    )
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and json.loads(done[0].arguments) == {"city": "Paris", "days": 3}
    assert any(e.type == "response.function_call_arguments.delta" for e in events)


def test_store_get_input_items_delete(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model="ninfer-tiny-dense", input="[[plain]] store me", instructions="Be kind."
    )
    fetched = client.responses.retrieve(response.id)
    assert fetched.id == response.id and fetched.output_text == response.output_text
    items = client.responses.input_items.list(response.id)
    assert len(items.data) == 1 and items.data[0].type == "message"
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.retrieve(response.id)
    assert info.value.body["code"] == "response_not_found"


def test_incomplete_on_max_output_tokens(client: openai.OpenAI) -> None:
    response = client.responses.create(model="ninfer-tiny-dense", input="[[long]] go", max_output_tokens=4)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"


def test_input_tokens_counts_the_prompt(client: openai.OpenAI) -> None:
    counted = client.post(
        "/responses/input_tokens",
        body={"model": "ninfer-tiny-dense", "input": "[[plain]] hi"},
        cast_to=object,
    )
    response = client.responses.create(model="ninfer-tiny-dense", input="[[plain]] hi")
    assert counted == {"object": "response.input_tokens", "input_tokens": response.usage.input_tokens}


def test_unknown_parameter_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="ninfer-tiny-dense", input="hi", extra_body={"bogus_field": 1})
    assert info.value.body["code"] == "unknown_parameter" and info.value.body["param"] == "bogus_field"


def test_real_engine_previous_response_id_reuses_prefix(real: openai.OpenAI) -> None:
    first = real.responses.create(model="tiny-alias", input="Responses real test.", max_output_tokens=3)
    assert first.status == "incomplete" and first.usage.output_tokens == 3
    second = real.responses.create(
        model="tiny-alias", previous_response_id=first.id, input="Continue.", max_output_tokens=3
    )
    assert second.usage.input_tokens_details.cached_tokens > 0
