"""Property-based fuzz of the three request schemas with hypothesis, beyond what schemathesis draws from the
OpenAPI document: nested histories, tool calls with arbitrary arguments and ids, content parts of every
kind, Responses items and Anthropic blocks of mixed types. Against the shared real server: never a 5xx,
never a hang (each request has a 30 s timeout), and the error shape of the calling protocol."""

from __future__ import annotations

import json
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ninfer_proc import MODEL, Server

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
TEXT = st.text(max_size=40)
PART = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "input_text", "output_text"]), "text": TEXT}),
    st.fixed_dictionaries({"type": st.sampled_from(["image_url", "image", "refusal", "bogus"]), "x": JSON}),
    JSON,
)
CONTENT = st.one_of(TEXT, st.lists(PART, max_size=3), JSON)
ARGUMENTS = st.one_of(JSON, JSON.map(json.dumps), TEXT)

CHAT_CALL = st.fixed_dictionaries(
    {"id": st.one_of(TEXT, JSON), "type": st.just("function"),
     "function": st.one_of(st.fixed_dictionaries({"name": TEXT, "arguments": ARGUMENTS}), JSON)}
)  # fmt: skip
CHAT_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "function", "bot"]),
     "content": CONTENT},
    optional={"tool_calls": st.one_of(st.lists(CHAT_CALL, max_size=2), JSON), "tool_call_id": JSON,
              "reasoning_content": st.one_of(TEXT, JSON), "name": JSON},
)  # fmt: skip
ANTHROPIC_BLOCK = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.one_of(TEXT, JSON)}),
    st.fixed_dictionaries({"type": st.just("thinking"), "thinking": st.one_of(TEXT, JSON)}),
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": JSON, "name": st.one_of(TEXT, JSON),
                           "input": JSON}),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": JSON, "content": CONTENT}),
    JSON,
)  # fmt: skip
ANTHROPIC_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system"]),
     "content": st.one_of(TEXT, st.lists(ANTHROPIC_BLOCK, max_size=3), JSON)}
)  # fmt: skip
RESPONSES_ITEM = st.one_of(
    st.fixed_dictionaries({"type": st.just("message"), "role": st.sampled_from(["user", "assistant", "x"]),
                           "content": CONTENT}),
    st.fixed_dictionaries({"type": st.just("reasoning"), "content": CONTENT}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": JSON, "name": st.one_of(TEXT, JSON),
                           "arguments": ARGUMENTS}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": JSON, "output": CONTENT}),
    JSON,
)  # fmt: skip
TOOLS = st.one_of(st.none(), st.lists(JSON, max_size=2), st.lists(st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "namespace", "custom"]), "name": TEXT, "function": JSON,
     "tools": JSON, "parameters": JSON}), max_size=2))  # fmt: skip

BODIES = st.one_of(
    st.tuples(st.just("/v1/chat/completions"), st.fixed_dictionaries(
        {"model": st.just(MODEL), "messages": st.lists(CHAT_MESSAGE, min_size=1, max_size=5),
         "max_tokens": st.integers(1, 2)},
        optional={"tools": TOOLS, "tool_choice": JSON, "stream": st.booleans(), "stop": JSON})),
    st.tuples(st.just("/v1/messages"), st.fixed_dictionaries(
        {"model": TEXT, "messages": st.lists(ANTHROPIC_MESSAGE, min_size=1, max_size=5),
         "max_tokens": st.integers(1, 2)},
        optional={"system": st.one_of(TEXT, st.lists(ANTHROPIC_BLOCK, max_size=2)), "tools": TOOLS,
                  "tool_choice": JSON, "thinking": JSON, "stream": st.booleans()})),
    st.tuples(st.just("/v1/responses"), st.fixed_dictionaries(
        {"model": st.just(MODEL), "input": st.one_of(TEXT, st.lists(RESPONSES_ITEM, min_size=1, max_size=5)),
         "max_output_tokens": st.integers(1, 2)},
        optional={"tools": TOOLS, "instructions": JSON, "reasoning": JSON, "text": JSON,
                  "stream": st.booleans()})),
)  # fmt: skip


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(case=BODIES)
def test_no_request_schema_body_gets_a_5xx_or_hangs(bad_input_server: Server, case: tuple[str, Any]) -> None:
    path, body = case
    response = httpx.post(bad_input_server.url + path, json=body, timeout=30)
    assert response.status_code < 500, f"{path} {body!r}: {response.status_code} {response.text[:300]}"
    if response.status_code >= 400:
        error = response.json()
        if path == "/v1/messages":
            assert error["type"] == "error" and error["error"]["message"], error
        else:
            assert error["error"]["message"] and error["error"]["code"], error
