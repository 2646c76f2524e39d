"""Error shapes through real HTTP: the bodies that once were 500s are 400s in the calling protocol's shape,
405 is typed as a client error, `max_tokens: 0` is refused alike on the three APIs, an unknown
`previous_response_id` is a 400, Anthropic messages name a field once, and a multi-MiB label is cut in
the request log."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from ninfer_proc import MODEL, Server, read_log

CHAT, MESSAGES, RESPONSES = "/v1/chat/completions", "/v1/messages", "/v1/responses"
DEEP = "1"
for _ in range(990):  # about where the converters and the template recursed past the limit
    DEEP = '{"a":' + DEEP + "}"


def _user(text: str = "hi") -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


ONCE_500: list[tuple[str, bytes | dict[str, Any]]] = [
    (CHAT, b'{"messages":[{"role":"user","content":"\xed\xa0\x80"}]}'),  # raw surrogate bytes
    (MESSAGES, b'{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"\xed\xa0\x80"}]}'),
    (RESPONSES, b'{"input":"\xed\xa0\x80"}'),
    (CHAT, {"messages": [*_user(), {"role": "assistant", "content": "", "tool_calls": 5}]}),
    (
        MESSAGES,
        {
            "model": "m",
            "max_tokens": 2,
            "messages": [
                *_user(),
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": {"x": 1}, "name": "f", "input": {}}],
                },
            ],
        },
    ),  # fmt: skip
    (RESPONSES, {"input": [{"type": "reasoning", "content": 5}]}),
    (RESPONSES, {"input": "hi", "text": {"format": "json"}}),
    (RESPONSES, {"input": "hi", "tools": [{"type": "namespace", "tools": 5}]}),
    (
        CHAT,
        (
            '{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"","tool_calls":[{"id":'
            '"c","type":"function","function":{"name":"f","arguments":' + DEEP + "}}]}]}"
        ).encode(),
    ),  # fmt: skip
]


def check_shape(path: str, response: httpx.Response, status: int = 400) -> dict[str, Any]:
    assert response.status_code == status, f"{path}: {response.status_code} {response.text[:300]}"
    body: dict[str, Any] = response.json()
    if path.startswith(MESSAGES):
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    else:
        assert body["error"]["type"] == "invalid_request_error" and body["error"]["code"], body
    return body


@pytest.mark.parametrize(("path", "body"), ONCE_500, ids=[f"{i}:{p}" for i, (p, _) in enumerate(ONCE_500)])
def test_bodies_that_were_500s_are_protocol_shaped_400s(
    bad_input_server: Server, path: str, body: bytes | dict[str, Any]
) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(bad_input_server.url + path, content=data, timeout=60)
    check_shape(path, response)


def test_405_is_a_client_error_in_both_shapes(bad_input_server: Server) -> None:
    openai = httpx.delete(bad_input_server.url + CHAT, timeout=10)
    anthropic = httpx.delete(bad_input_server.url + MESSAGES, timeout=10)
    assert openai.status_code == anthropic.status_code == 405
    assert openai.json()["error"]["type"] == "invalid_request_error"
    assert anthropic.json()["error"]["type"] == "invalid_request_error"


def test_max_tokens_0_and_unknown_previous_response_are_400s(bad_input_server: Server) -> None:
    url = bad_input_server.url
    cases = [
        (CHAT, {"model": MODEL, "max_tokens": 0, "messages": _user()}),
        (CHAT, {"model": MODEL, "max_completion_tokens": 0, "messages": _user()}),
        (MESSAGES, {"model": MODEL, "max_tokens": 0, "messages": _user()}),
        (RESPONSES, {"model": MODEL, "max_output_tokens": 0, "input": "hi"}),
    ]
    for path, body in cases:
        check_shape(path, httpx.post(url + path, json=body, timeout=30))
    missing = httpx.post(
        url + RESPONSES, json={"input": "hi", "previous_response_id": "resp_nope"}, timeout=30
    )
    assert check_shape(RESPONSES, missing)["error"]["code"] == "previous_response_not_found"


def test_anthropic_messages_name_the_field_once(bad_input_server: Server) -> None:
    response = httpx.post(
        bad_input_server.url + MESSAGES, json={"max_tokens": 2, "messages": _user()}, timeout=30
    )
    message = check_shape(MESSAGES, response)["error"]["message"]
    assert message.count("model") == 1, message


def test_a_huge_model_label_is_cut_in_the_request_log(bad_input_server: Server) -> None:
    label = "m" * 600_000
    body = {"model": label, "max_tokens": 1, "messages": _user()}
    response = httpx.post(bad_input_server.url + MESSAGES, json=body, timeout=60)
    assert response.status_code == 200 and response.json()["model"] == label  # echoed whole
    request_id = response.headers["request-id"]
    start = next(r for r in read_log(bad_input_server) if r.get("request_id") == request_id)
    assert len(start["model"]) < 2000 and start["model"].endswith("chars)")
