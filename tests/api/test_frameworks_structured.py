"""Agent libraries on the default paths that need grammar-constrained decoding, against a scripted
`ninfer-serve` (real HTTP, real libraries): strict function tools (pydantic-ai, the OpenAI Agents SDK's
`@function_tool`), output tools forced by `tool_choice` required / named with `parallel_tool_calls=false`
(pydantic-ai `output_type`, LangChain `with_structured_output(method="function_calling")`, `create_agent`
with `response_format`), JSON outputs (`json_schema` / `json_object`, the SDKs' `parse` helpers).

The scripted engine emits its script whatever the constraint, so these tests check that each library's
request is accepted and its answer read back; that the grammar, not the model, makes the output valid is
tested where the grammar is built."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from api_helpers import Server, stop_server
from framework_helpers import MODEL, WEATHER_JSON, start_scripted
from pydantic import BaseModel

ANSWER = "It will be sunny in Paris."
ASK_TOOL = "[[tool]] What is the weather in Paris?"
EXPECTED = {"city": "Paris", "temperature": 21}


class Weather(BaseModel):
    """Weather in a city."""

    city: str
    temperature: int


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    started = start_scripted(tmp_path_factory.mktemp("frameworks_structured"))
    yield started
    stop_server(started.process)


def _pydantic_ai_model(server: Server, model_class: str):  # type: ignore[no-untyped-def]
    from pydantic_ai.models import openai as models
    from pydantic_ai.providers.openai import OpenAIProvider

    return getattr(models, model_class)(MODEL, provider=OpenAIProvider(base_url=server.v1, api_key="unused"))


@pytest.mark.parametrize("model_class", ["OpenAIChatModel", "OpenAIResponsesModel"])
def test_pydantic_ai_agent_with_a_strict_tool(server: Server, model_class: str) -> None:
    from pydantic_ai import Agent

    agent = Agent(_pydantic_ai_model(server, model_class))
    seen: list[tuple[str, int]] = []

    @agent.tool_plain
    def get_weather(city: str, days: int) -> str:  # every parameter required: pydantic-ai sends strict
        """Weather forecast for a city."""
        seen.append((city, days))
        return "sunny"

    result = agent.run_sync(ASK_TOOL)
    assert result.output == ANSWER and seen == [("Paris", 3)]


@pytest.mark.parametrize("model_class", ["OpenAIChatModel", "OpenAIResponsesModel"])
def test_pydantic_ai_output_type(server: Server, model_class: str) -> None:
    from pydantic_ai import Agent

    agent = Agent(_pydantic_ai_model(server, model_class), output_type=Weather)
    assert agent.run_sync("[[final_result]] Weather in Paris?").output == Weather(**EXPECTED)


@pytest.mark.parametrize("model_class", ["OpenAIChatCompletionsModel", "OpenAIResponsesModel"])
def test_openai_agents_sdk_function_tool(server: Server, model_class: str) -> None:
    import agents
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=server.v1, api_key="unused", max_retries=0)
    seen: list[tuple[str, int]] = []

    @agents.function_tool
    def get_weather(city: str, days: int) -> str:
        """Weather forecast for a city."""
        seen.append((city, days))
        return "sunny"

    model = getattr(agents, model_class)(model=MODEL, openai_client=client)
    agent = agents.Agent(name="weather", model=model, tools=[get_weather])
    result = agents.Runner.run_sync(agent, ASK_TOOL)
    assert result.final_output == ANSWER and seen == [("Paris", 3)]


@pytest.mark.parametrize(
    ("method", "ask"),
    [("json_schema", "weather_json"), ("function_calling", "weather_tool"), ("json_mode", "weather_json")],
)
def test_langchain_with_structured_output(server: Server, method: str, ask: str) -> None:
    from langchain_openai import ChatOpenAI

    model = ChatOpenAI(model=MODEL, base_url=server.v1, api_key="unused", max_retries=0)  # type: ignore[arg-type]
    structured = model.with_structured_output(Weather, method=method)  # type: ignore[arg-type]
    assert structured.invoke(f"[[{ask}]] Weather in Paris as JSON with city and temperature?") == Weather(
        **EXPECTED
    )


def test_langchain_create_agent_with_response_format(server: Server) -> None:
    from langchain.agents import create_agent
    from langchain_openai import ChatOpenAI

    model = ChatOpenAI(model=MODEL, base_url=server.v1, api_key="unused", max_retries=0)  # type: ignore[arg-type]
    agent = create_agent(model, tools=[], response_format=Weather)
    result = agent.invoke({"messages": [{"role": "user", "content": "[[weather_tool]] Weather in Paris?"}]})
    assert result["structured_response"] == Weather(**EXPECTED)


def test_sdk_parse_helpers(server: Server) -> None:
    import anthropic
    import openai

    client = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)
    ask = [{"role": "user", "content": "[[weather_json]] Weather in Paris?"}]
    parsed = client.chat.completions.parse(model=MODEL, messages=ask, response_format=Weather)  # type: ignore[arg-type]
    assert parsed.choices[0].message.parsed == Weather(**EXPECTED)
    response = client.responses.parse(
        model=MODEL, input="[[weather_json]] Weather in Paris?", text_format=Weather
    )
    assert response.output_parsed == Weather(**EXPECTED)
    obj = client.chat.completions.create(model=MODEL, messages=ask, response_format={"type": "json_object"})  # type: ignore[arg-type]
    assert json.loads(obj.choices[0].message.content or "") == json.loads(WEATHER_JSON)
    claude = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    message = claude.messages.parse(model="claude-any", max_tokens=300, messages=ask, output_format=Weather)  # type: ignore[arg-type]
    assert message.parsed_output == Weather(**EXPECTED)


def test_legacy_function_call_forcing_a_function(server: Server) -> None:
    import openai

    client = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)
    function = {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        },
    }
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": ASK_TOOL}], functions=[function],  # type: ignore[list-item]
        function_call={"name": "get_weather"},
    )  # fmt: skip
    call = reply.choices[0].message.function_call
    assert reply.choices[0].finish_reason == "function_call"
    assert call is not None and json.loads(call.arguments) == {"city": "Paris", "days": 3}
