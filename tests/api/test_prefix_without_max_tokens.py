"""A repeated prompt without `max_tokens` reuses its prefix on all three APIs (real engine, official SDKs).

Admission reserves only the prompt's KV pages (the output grows page by page), so a prefix match is
never dropped for lack of room for the whole default output. The server here keeps the default output
budget (no `--default-max-tokens`) on a pool of exactly one `max_context` (two 64-token pages), which
the old up-front reservation filled on its own. An output limit above the remaining context is clamped
to it and ends as each protocol's context limit (`length`, `model_context_window_exceeded`, `incomplete`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from api_helpers import VENV_BIN, Server, free_port, start_server, stop_server

MAX_CONTEXT = 128
MODEL = "ninfer-tiny-dense"
SYSTEM = "You are a careful assistant who answers in one short sentence."
QUESTION = "Name one colour of the sky at dusk, please."


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("prefix_server")
    port = free_port()
    cmd = [str(VENV_BIN / "ninfer-serve"), "--port", str(port), "--max-context", str(MAX_CONTEXT),
           "--kv-capacity", str(MAX_CONTEXT), "--log-stats-interval-ms", "0"]  # fmt: skip
    url, process = start_server(cmd, root / "server.log", port)
    yield Server(url, process, root / "server.log")
    stop_server(process)


@pytest.fixture(scope="module")
def oai(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)


def messages(question: str) -> list[Any]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def test_chat_completions_without_max_tokens_reports_cached_tokens(oai: openai.OpenAI) -> None:
    runs = [
        oai.chat.completions.create(model=MODEL, messages=messages(QUESTION), temperature=0) for _ in range(2)
    ]
    first, second = runs
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens > 0
    assert second.choices[0].message.content == first.choices[0].message.content
    for run in runs:  # no max_tokens: the output is bounded by the context, ending as a length limit
        assert run.usage.prompt_tokens + run.usage.completion_tokens <= MAX_CONTEXT
        if run.choices[0].finish_reason != "stop":
            assert run.choices[0].finish_reason == "length"
            assert run.usage.prompt_tokens + run.usage.completion_tokens == MAX_CONTEXT


def test_responses_without_max_output_tokens_reports_cached_tokens(oai: openai.OpenAI) -> None:
    question = "Responses: " + QUESTION
    runs = [
        oai.responses.create(model=MODEL, instructions=SYSTEM, input=question, temperature=0)
        for _ in range(2)
    ]
    assert runs[0].usage.input_tokens_details.cached_tokens == 0
    assert runs[1].usage.input_tokens_details.cached_tokens > 0
    for run in runs:
        assert run.usage.input_tokens + run.usage.output_tokens <= MAX_CONTEXT
        if run.status != "completed":
            assert run.status == "incomplete" and run.incomplete_details.reason == "max_output_tokens"


def test_anthropic_max_tokens_above_the_context_is_clamped_and_reports_cached_tokens(server: Server) -> None:
    """The Anthropic SDK requires max_tokens: one far above the context is the same case (clamped)."""
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120.0)
    question = "Anthropic: " + QUESTION
    runs = [
        client.messages.create(
            model=MODEL,
            max_tokens=100_000,
            system=SYSTEM,
            messages=[{"role": "user", "content": question}],
        )  # fmt: skip
        for _ in range(2)
    ]
    assert not runs[0].usage.cache_read_input_tokens
    assert runs[1].usage.cache_read_input_tokens > 0
    for run in runs:
        total = run.usage.input_tokens + (run.usage.cache_read_input_tokens or 0) + run.usage.output_tokens
        assert total <= MAX_CONTEXT
        if run.stop_reason != "end_turn":
            assert run.stop_reason == "model_context_window_exceeded" and total == MAX_CONTEXT


def test_chat_completions_max_tokens_above_the_context_is_clamped(oai: openai.OpenAI) -> None:
    run = oai.chat.completions.create(model=MODEL, messages=messages("Clamp: " + QUESTION), max_tokens=100_000,
                                      temperature=0)  # fmt: skip
    assert run.usage.prompt_tokens + run.usage.completion_tokens <= MAX_CONTEXT
    assert run.choices[0].finish_reason in ("length", "stop")
