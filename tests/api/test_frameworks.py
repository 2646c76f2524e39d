"""Agent libraries on their default paths against a scripted `ninfer-serve` (real HTTP, real libraries):
LangChain `create_agent` with a tool (langchain-openai and langchain-anthropic), LangChain's Anthropic chat
model returning plain text content, the Anthropic SDK's `tool_runner` (its message-threads beta is refused
as the SDK expects, and it goes on unthreaded), litellm on both protocols, and a pydantic-ai agent with a
tool on both OpenAI model classes. Paths that need grammar-constrained decoding (strict tools, required or
named tool_choice, JSON outputs) are in test_frameworks_structured.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from api_helpers import Server, stop_server
from framework_helpers import MODEL, start_scripted

ANSWER = "It will be sunny in Paris."  # the scripted answer after a tool result
ASK_TOOL = "[[tool]] What is the weather in Paris?"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    started = start_scripted(tmp_path_factory.mktemp("frameworks"))
    yield started
    stop_server(started.process)


def get_weather(city: str, days: int = 1) -> str:
    """Weather forecast for a city.

    Args:
        city: the city
        days: how many days
    """
    return f"sunny in {city} for {days} days"


def test_langchain_create_agent_runs_a_tool_round_trip(server: Server) -> None:
    from langchain.agents import create_agent
    from langchain_anthropic import ChatAnthropic
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    calls: list[dict[str, Any]] = []

    @tool
    def weather(city: str, days: int) -> str:
        """Weather forecast for a city."""
        calls.append({"city": city, "days": days})
        return "sunny"

    weather.name = "get_weather"
    models = [
        ChatOpenAI(model=MODEL, base_url=server.v1, api_key="unused", max_retries=0),
        ChatAnthropic(model="claude-any", base_url=server.url, api_key="unused", max_retries=0),  # type: ignore[call-arg]
    ]
    for model in models:
        agent = create_agent(model, tools=[weather])
        result = agent.invoke({"messages": [{"role": "user", "content": ASK_TOOL}]})
        assert result["messages"][-1].content == ANSWER  # text content: a str, not a list of blocks
    assert calls == [{"city": "Paris", "days": 3}] * 2


def test_langchain_anthropic_content_is_the_answer_text(server: Server) -> None:
    from langchain_anthropic import ChatAnthropic

    model = ChatAnthropic(model="claude-any", base_url=server.url, api_key="unused", max_retries=0)  # type: ignore[call-arg]
    reply = model.invoke("[[plain]] Hello")
    assert reply.content == "Hello! I am a scripted model."


def test_anthropic_tool_runner_falls_back_from_threads_and_finishes(server: Server) -> None:
    import anthropic
    from anthropic import beta_tool

    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    runner = client.beta.messages.tool_runner(
        model="claude-any",
        max_tokens=500,
        tools=[beta_tool(get_weather)],
        messages=[{"role": "user", "content": ASK_TOOL}],
    )
    replies = list(runner)
    assert [b.type for b in replies[0].content] == ["text", "tool_use"]
    assert replies[0].content[1].input == {"city": "Paris", "days": 3}  # type: ignore[union-attr]
    assert replies[-1].content[-1].text == ANSWER  # type: ignore[union-attr]
    assert len(replies) == 2


def test_litellm_on_both_protocols(server: Server) -> None:
    import litellm

    reply = litellm.completion(
        model=f"openai/{MODEL}",
        api_base=server.v1,
        api_key="unused",
        messages=[{"role": "user", "content": "[[plain]] hi"}],
    )
    assert reply.choices[0].message.content == "Hello! I am a scripted model."
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                },
            },
        }
    ]
    reply = litellm.completion(
        model=f"openai/{MODEL}",
        api_base=server.v1,
        api_key="unused",
        messages=[{"role": "user", "content": ASK_TOOL}],
        tools=tools,
    )
    call = reply.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {
        "city": "Paris",
        "days": 3,
    }
    reply = litellm.completion(
        model="anthropic/claude-any", api_base=server.url, api_key="unused", max_tokens=200,
        messages=[{"role": "user", "content": "[[plain]] hi"}],
    )  # fmt: skip
    assert reply.choices[0].message.content == "Hello! I am a scripted model."


@pytest.mark.parametrize("model_class", ["OpenAIChatModel", "OpenAIResponsesModel"])
def test_pydantic_ai_agent_calls_a_tool(server: Server, model_class: str) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models import openai as models
    from pydantic_ai.providers.openai import OpenAIProvider

    model = getattr(models, model_class)(MODEL, provider=OpenAIProvider(base_url=server.v1, api_key="unused"))
    agent = Agent(model)
    seen: list[tuple[str, int]] = []

    @agent.tool_plain
    def get_weather(city: str, days: int = 1) -> str:  # an optional parameter: a non-strict tool
        """Weather forecast for a city."""
        seen.append((city, days))
        return "sunny"

    result = agent.run_sync(ASK_TOOL)
    assert result.output == ANSWER and seen == [("Paris", 3)]
