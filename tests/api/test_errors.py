"""Every error in its protocol's shape: OpenAI `{"error": {...}}`, Anthropic `{"type": "error", ...}`;
the SDKs raise their own exception types; never a 500 for bad input."""

from __future__ import annotations

import re
import threading
from typing import Any

import anthropic
import httpx
import openai
import pytest
from api_helpers import API_KEY, Server

AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def oa(scripted_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=scripted_server.v1, api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def an(scripted_server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=scripted_server.url, api_key=API_KEY, max_retries=0)


def chat(oa: openai.OpenAI, **fields: Any) -> Any:
    body: dict[str, Any] = {
        "model": "ninfer-tiny-dense",
        "messages": [{"role": "user", "content": "hi"}],
        **fields,
    }
    return oa.chat.completions.create(**body)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 9}, "n"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"temperature": 5.0}, "temperature"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {
                "tool_choice": {"type": "function", "function": {"name": "g"}},
                "tools": [{"type": "function", "function": {"name": "f"}}],
            },
            "tool_choice",
        ),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "strict": True, "parameters": {"not": {}}}}
                ]
            },
            "tools[0].function.parameters",
        ),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"logit_bias": {"42": 5}}, "logit_bias"),
    ],
)
def test_openai_field_specific_400(oa: openai.OpenAI, fields: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        chat(oa, **fields)
    assert info.value.status_code == 400
    assert info.value.body["param"] == param and info.value.body["type"] == "invalid_request_error"


def test_image_part_is_vision_disabled(oa: openai.OpenAI) -> None:
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with pytest.raises(openai.BadRequestError) as info:
        chat(oa, messages=[{"role": "user", "content": [part]}])
    assert info.value.body["code"] == "vision_disabled"


def test_template_error_is_a_400(oa: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        chat(oa, messages=[{"role": "assistant", "content": "no user query"}])
    assert "user query" in info.value.body["message"]


def test_bad_api_key_is_401_in_both_shapes(scripted_server: Server) -> None:
    bad = openai.OpenAI(base_url=scripted_server.v1, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        bad.models.list()
    assert info.value.body["code"] == "invalid_api_key"
    bad_an = anthropic.Anthropic(base_url=scripted_server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as info2:
        bad_an.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert info2.value.body["type"] == "error" and info2.value.body["error"]["type"] == "authentication_error"


def test_x_api_key_header_works_and_health_stats_metrics_are_exempt(scripted_server: Server) -> None:
    assert httpx.get(f"{scripted_server.v1}/models", headers={"x-api-key": API_KEY}).status_code == 200
    for path in ("/health", "/stats", "/metrics"):
        assert httpx.get(f"{scripted_server.url}{path}").status_code == 200
    response = httpx.get(f"{scripted_server.v1}/models", headers=AUTH)
    assert response.headers["x-request-id"].startswith("req_")


def test_invalid_json_and_unknown_route(scripted_server: Server) -> None:
    response = httpx.post(f"{scripted_server.v1}/chat/completions", content=b"{not json", headers=AUTH)
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"
    response = httpx.post(f"{scripted_server.v1}/messages", content=b"[1]", headers=AUTH)
    assert response.status_code == 400 and response.json()["type"] == "error"
    assert response.headers["request-id"].startswith("req_")
    response = httpx.get(f"{scripted_server.v1}/nothing-here", headers=AUTH)
    assert response.status_code == 404 and "error" in response.json()


def test_body_over_max_request_mib_is_413(scripted_server: Server) -> None:
    big = b'{"messages": "' + b"x" * (1024 * 1024 + 10) + b'"}'
    response = httpx.post(f"{scripted_server.v1}/chat/completions", content=big, headers=AUTH)
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"

    def chunks() -> Any:  # no content-length: counted while streaming in
        for _ in range(20):
            yield b"x" * 65536

    response = httpx.post(f"{scripted_server.v1}/chat/completions", content=chunks(), headers=AUTH)
    assert response.status_code == 413


def test_unknown_model_is_404(oa: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        chat(oa, model="gpt-9")
    assert info.value.body["code"] == "model_not_found"


def _occupy(scripted_server: Server, started: threading.Event) -> None:
    body = {
        "model": "ninfer-tiny-dense",
        "messages": [{"role": "user", "content": "[[long]] x"}],
        "stream": True,
    }
    with httpx.stream(
        "POST", f"{scripted_server.v1}/chat/completions", json=body, headers=AUTH, timeout=30
    ) as r:
        for _ in r.iter_lines():
            started.set()


def test_overload_is_429_openai_and_529_anthropic(
    scripted_server: Server, oa: openai.OpenAI, an: anthropic.Anthropic
) -> None:
    started = threading.Event()
    worker = threading.Thread(target=_occupy, args=(scripted_server, started))
    worker.start()
    try:
        assert started.wait(10)
        with pytest.raises(openai.RateLimitError) as info:
            chat(oa)
        assert info.value.body["code"] == "server_overloaded"
        with pytest.raises(anthropic.APIStatusError) as info2:
            an.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
        assert info2.value.status_code == 529
        assert info2.value.body["error"]["type"] == "overloaded_error"
    finally:
        worker.join()


def test_keepalive_comment_during_silence(scripted_server: Server) -> None:
    body = {
        "model": "ninfer-tiny-dense",
        "messages": [{"role": "user", "content": "[[pause]] x"}],
        "stream": True,
    }
    with httpx.stream(
        "POST", f"{scripted_server.v1}/chat/completions", json=body, headers=AUTH, timeout=30
    ) as r:
        lines = [line for line in r.iter_lines() if line]
    assert ": keep-alive" in lines
    assert lines[-1] == "data: [DONE]"


def _counter(server: Server, name: str, labels: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    match = re.search(rf"^{name}\{{{re.escape(labels)}\}} ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_n_choices_whose_later_choice_is_refused_count_as_rejected(
    scripted_server: Server, oa: openai.OpenAI
) -> None:
    """One lane, no pending place: choice 0 takes the lane, choice 1 is refused (429). The client got the
    refusal, so /metrics counts a rejection (not choice 0's ending) and nothing stays in flight."""
    rejected = ("ninfer_requests_rejected_total", 'api="openai_chat",code="server_overloaded"')
    stopped = ("ninfer_requests_total", 'api="openai_chat",finish_reason="stop"')
    before = [_counter(scripted_server, *c) for c in (rejected, stopped)]
    for stream in (True, False):
        with pytest.raises(openai.RateLimitError) as info:
            chat(oa, messages=[{"role": "user", "content": "[[long]] x"}], n=2, stream=stream)
        assert info.value.body["code"] == "server_overloaded"
    after = [_counter(scripted_server, *c) for c in (rejected, stopped)]
    assert after[0] - before[0] == 2 and after[1] == before[1]
    assert httpx.get(f"{scripted_server.url}/stats", timeout=10).json()["http"]["in_flight"] == 0
