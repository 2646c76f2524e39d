"""Bad input against a real server: oversized bodies, context overflow, invalid UTF-8 and malformed JSON,
absurd sampling values, tools with broken schemas. Every answer is a 4xx in the protocol's own error
shape (or a 200 where the value is legal), never a 5xx or a hang; afterwards the engine is healthy and
the request log has exactly one ending for every request id the server handed out."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

import httpx
import pytest
from ninfer_proc import MODEL, Server, assert_healthy, assert_log_accounts

OPENAI = "/v1/chat/completions"
ANTHROPIC = "/v1/messages"
RESPONSES = "/v1/responses"


def _msg(text: str = "hi") -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def _request_id(response: httpx.Response) -> str | None:
    return response.headers.get("x-request-id") or response.headers.get("request-id")


def _check_shape(path: str, response: httpx.Response) -> None:
    """A 4xx in the calling protocol's error shape; a 200 reads to its end."""
    assert response.status_code < 500, f"{path}: {response.status_code} {response.text[:500]}"
    if response.status_code == 200:
        return
    body = response.json()
    if path.startswith(ANTHROPIC):
        assert body["type"] == "error" and body["error"]["type"] and body["error"]["message"], body
    else:
        assert body["error"]["message"] and body["error"]["code"], body


def _send_all(server: Server, cases: Iterable[tuple[str, bytes | dict[str, Any]]]) -> list[str]:
    """POST every case (raw bytes or a JSON object), check each answer, return the request ids."""
    ids = []
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for path, body in cases:
            if isinstance(body, bytes):
                response = client.post(path, content=body, headers={"content-type": "application/json"})
            else:
                response = client.post(path, content=json.dumps(body, allow_nan=True))
            _check_shape(path, response)
            request_id = _request_id(response)
            assert request_id, f"{path}: no request id header"
            ids.append(request_id)
    return ids


def _assert_all_logged(server: Server, ids: list[str]) -> None:
    ends = {r["request_id"] for r in assert_log_accounts(server)}
    missing = [i for i in ids if i not in ends]
    assert not missing, (
        f"{len(missing)} of {len(ids)} requests have no ending in the request log: {missing[:5]}"
    )


def _finish(server: Server, ids: list[str]) -> None:
    assert_healthy(server)
    _assert_all_logged(server, ids)


def test_oversized_body_is_413_in_both_shapes(bad_input_server: Server) -> None:
    server = bad_input_server
    big = "x" * (1024 * 1024 + 10)
    ids = []
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for path, body in (
            (OPENAI, {"model": MODEL, "messages": _msg(big)}),
            (ANTHROPIC, {"model": MODEL, "max_tokens": 4, "messages": _msg(big)}),
        ):
            declared = client.post(path, json=body)  # Content-Length over the limit
            chunked = client.post(path, content=iter([json.dumps(body).encode()[i : i + 65536] for i in
                                                      range(0, len(big) + 200, 65536)]))  # fmt: skip
            for response in (declared, chunked):
                assert response.status_code == 413, response.text[:300]
                _check_shape(path, response)
                ids.append(_request_id(response) or "")
    _finish(server, ids)


def test_context_overflow(bad_input_server: Server) -> None:
    server = bad_input_server
    long = "hello " * (server.max_context + 50)
    near_full = "hello " * (server.max_context - 40)
    cases: list[tuple[str, bytes | dict[str, Any]]] = [
        (OPENAI, {"model": MODEL, "messages": _msg(long)}),
        (OPENAI, {"model": MODEL, "messages": _msg(long), "stream": True}),
        (ANTHROPIC, {"model": MODEL, "max_tokens": 4, "messages": _msg(long)}),
        (ANTHROPIC, {"model": MODEL, "max_tokens": 4, "messages": _msg(long), "stream": True}),
        (RESPONSES, {"model": MODEL, "input": long}),
        # Fits, but asks for more output than the context leaves: capped at the context (200) or refused.
        (OPENAI, {"model": MODEL, "messages": _msg(near_full), "max_tokens": 10**6}),
        (ANTHROPIC, {"model": MODEL, "max_tokens": 10**6, "messages": _msg(near_full), "stream": True}),
    ]
    with httpx.Client(base_url=server.url, timeout=60) as client:
        first = client.post(OPENAI, json=cases[0][1])
        assert first.status_code == 400 and first.json()["error"]["code"] == "context_length_exceeded"
    ids = [_request_id(first) or ""] + _send_all(server, cases)
    _finish(server, ids)


MALFORMED: list[bytes] = [
    b"",
    b"{",
    b'{"model": "x", "messages": [',
    b'{"model": "x"} trailing',
    b"[]",
    b"42",
    b'"just a string"',
    b"null",
    b'{"model": "\xff\xfe", "messages": [{"role": "user", "content": "hi"}]}',
    b'{"messages": [{"role": "user", "content": "\xc3\x28"}]}',
    b"\xef\xbb\xbf{}",
    b'{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 2}',
    b'{"messages": [{"role": "user", "content": "a\\u0000b"}], "max_tokens": 2}',
    b'{"messages": NaN}',
    b'{"max_tokens": Infinity, "messages": [{"role": "user", "content": "hi"}]}',
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
]


@pytest.mark.parametrize("path", [OPENAI, ANTHROPIC, RESPONSES])
def test_invalid_utf8_and_malformed_json(bad_input_server: Server, path: str) -> None:
    ids = _send_all(bad_input_server, [(path, body) for body in MALFORMED])
    _finish(bad_input_server, ids)


def _absurd_sampling() -> list[dict[str, Any]]:
    values: dict[str, list[Any]] = {
        "temperature": [-1, 1e308, math.inf, math.nan, "hot", 0, 1e-30, 1000],
        "top_p": [-0.5, 0, 5, 1e308, math.nan],
        "top_k": [-5, 0, 21, 10**12, 1.5],
        "min_p": [-1, 2, math.inf],
        "presence_penalty": [-1e9, 1e9, math.nan],
        "frequency_penalty": [-1e308, 1e308],
        "seed": [-1, 2**70, "seed", 1.5],
        "max_tokens": [-1, 0, 10**12, 2**63, "many", 1.0],
        "stop": [[""], ["a"] * 500, "", [1, 2], [None], "x" * 10_000],
        "n": [0, 2, 10**9],
        "logit_bias": [{"1": 1e308}, {"x": 1}],
        "logprobs": [True],
    }
    return [{name: value} for name, options in values.items() for value in options]


def test_absurd_sampling_values(bad_input_server: Server) -> None:
    server = bad_input_server
    cases: list[tuple[str, bytes | dict[str, Any]]] = []
    for extra in _absurd_sampling():
        stream = len(cases) % 2 == 1
        # A huge max_tokens runs to the end of the context: start near it so that stays a few tokens.
        text = "hello " * (server.max_context - 40) if "max_tokens" in extra else "hi"
        body = {"model": MODEL, "messages": _msg(text), "max_tokens": 2, "stream": stream, **extra}
        cases.append((OPENAI, body))
        anthropic_extra = {("stop_sequences" if k == "stop" else k): v for k, v in extra.items()}
        body = {"model": MODEL, "max_tokens": 2, "messages": _msg(text), "stream": stream, **anthropic_extra}
        cases.append((ANTHROPIC, body))
        responses_extra = {("max_output_tokens" if k == "max_tokens" else k): v for k, v in extra.items()}
        cases.append((RESPONSES, {"model": MODEL, "input": text, "max_output_tokens": 2, **responses_extra}))
    ids = _send_all(server, cases)
    _finish(server, ids)


BROKEN_OPENAI_TOOLS: list[Any] = [
    "not a list",
    [None],
    [{}],
    [{"type": "function"}],
    [{"type": "function", "function": {}}],
    [{"type": "function", "function": {"name": ""}}],
    [{"type": "function", "function": {"name": "f", "parameters": "not an object"}}],
    [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": []}}}],
    [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {
                    "$ref": "#/definitions/loop",
                    "definitions": {"loop": {"$ref": "#/definitions/loop"}},
                },
            },
        }
    ],  # fmt: skip
    [{"type": "function", "function": {"name": "f" * 10_000, "description": "\x00" * 10}}],
    [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}] * 300,
    [{"type": "retrieval"}],
    [
        {
            "type": "function",
            "function": {"name": "f", "parameters": json.loads('{"a":' * 200 + "1" + "}" * 200)},
        }
    ],
]
BROKEN_ANTHROPIC_TOOLS: list[Any] = [
    "nope",
    [{}],
    [{"name": "f"}],
    [{"name": "f", "input_schema": "string"}],
    [{"name": "f", "input_schema": {"type": "object", "properties": {"x": {"$ref": "#/nowhere"}}}}],
    [{"name": "", "input_schema": {"type": "object"}}],
    [{"type": "computer_20250124", "name": "computer"}],
]


def test_tools_with_broken_schemas(bad_input_server: Server) -> None:
    cases: list[tuple[str, bytes | dict[str, Any]]] = []
    for i, tools in enumerate(BROKEN_OPENAI_TOOLS):
        body = {
            "model": MODEL,
            "messages": _msg("call f"),
            "max_tokens": 2,
            "tools": tools,
            "stream": i % 2 == 1,
        }
        cases.append((OPENAI, body))
        cases.append((OPENAI, {**body, "tools": BROKEN_OPENAI_TOOLS[6], "tool_choice": {"type": "function",
                                                                                         "function": {"name": "g"}}}))  # fmt: skip
        responses_tools = tools if not isinstance(tools, list) else [
            {"type": "function", **(t.get("function") or {})} if isinstance(t, dict) else t for t in tools
        ]  # fmt: skip
        cases.append(
            (RESPONSES, {"model": MODEL, "input": "call f", "max_output_tokens": 2, "tools": responses_tools})
        )
    for i, tools in enumerate(BROKEN_ANTHROPIC_TOOLS):
        body = {
            "model": MODEL,
            "max_tokens": 2,
            "messages": _msg("call f"),
            "tools": tools,
            "stream": i % 2 == 0,
        }
        cases.append((ANTHROPIC, body))
        cases.append((ANTHROPIC, {**body, "tool_choice": {"type": "tool", "name": "missing"}}))
    ids = _send_all(bad_input_server, cases)
    _finish(bad_input_server, ids)
