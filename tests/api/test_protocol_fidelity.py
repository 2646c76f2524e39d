"""Protocol points fixed to what the official APIs do, through the official SDKs on the scripted server:
several system messages, `top_k` above 20, stop strings that cut only the answer, the legacy `functions` /
`function_call`, and reasoning-effort tiers as thinking budgets (Chat and Responses)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest
from api_helpers import API_KEY, Server
from scripted import SCRIPTS

FUNCTION = {
    "name": "get_weather",
    "description": "Weather forecast for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
}
ARGS = {"city": "Paris", "days": 3}
MODEL = "ninfer-tiny-dense"


@pytest.fixture(scope="module")
def client(scripted_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=scripted_server.v1, api_key=API_KEY, max_retries=0)


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


def test_several_system_messages_join_into_the_system_turn(client: openai.OpenAI) -> None:
    two = [{"role": "system", "content": "Be brief."}, {"role": "developer", "content": "Be kind."}]
    joined = [{"role": "system", "content": "Be brief.\n\nBe kind."}]
    late = [*user("[[plain]] hi"), {"role": "system", "content": "Answer in French."}]
    counts = []
    for messages in (two + user("[[plain]] hi"), joined + user("[[plain]] hi")):
        reply = client.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
        assert reply.choices[0].message.content == "Hello! I am a scripted model."
        counts.append(reply.usage.prompt_tokens)  # type: ignore[union-attr]
    assert counts[0] == counts[1]
    assert client.chat.completions.create(model=MODEL, messages=late).choices[0].finish_reason == "stop"  # type: ignore[arg-type]


def test_top_k_above_twenty_is_accepted(client: openai.OpenAI, scripted_server: Server) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=user("[[plain]] hi"), extra_body={"top_k": 50}
    )
    assert reply.choices[0].message.content == "Hello! I am a scripted model."
    claude = anthropic.Anthropic(base_url=scripted_server.url, api_key=API_KEY, max_retries=0)
    message = claude.messages.create(
        model=MODEL, max_tokens=100, messages=user("[[plain]] hi"), extra_body={"top_k": 64}
    )
    assert message.content[0].text == "Hello! I am a scripted model."  # type: ignore[union-attr]
    with pytest.raises(openai.BadRequestError) as info:  # beyond any vocabulary: a 400, not a crash
        client.chat.completions.create(model=MODEL, messages=user("hi"), extra_body={"top_k": 10**20})
    assert info.value.body["param"] == "top_k"  # type: ignore[index]


def test_a_stop_string_in_the_reasoning_does_not_cut_it(client: openai.OpenAI) -> None:
    for stream in (False, True):
        kwargs: dict[str, Any] = dict(model=MODEL, messages=user("[[stop]] count"), stop=["Count", "STOP"])
        if stream:
            chunks = list(client.chat.completions.create(stream=True, **kwargs))
            deltas = [c.choices[0].delta for c in chunks if c.choices]
            reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
            content = "".join(d.content or "" for d in deltas)
            finish = next(
                c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
            )
        else:
            message = client.chat.completions.create(**kwargs).choices[0]
            reasoning = message.message.reasoning_content  # type: ignore[attr-defined]
            content, finish = message.message.content, message.finish_reason
        assert reasoning == "Counting."  # holds "Count": the reasoning is not matched
        assert content == "one two" and finish == "stop"  # the answer is


def test_a_stop_string_inside_a_tool_call_does_not_cut_it(
    client: openai.OpenAI, scripted_server: Server
) -> None:
    """ "a" occurs in the call's markup (`<tool_call>`, `get_weather`, `<parameter=days>`, "Paris") but not in the
    answer's text: the call arrives whole (it used to end as the content "...<tool_c", no call); Anthropic's
    stop_sequences the same. A stop string in the text after a call still ends the answer there."""
    tools = [{"type": "function", "function": FUNCTION}]
    for stream in (False, True):
        kwargs: dict[str, Any] = dict(
            model=MODEL, messages=user("[[tool]] weather?"), tools=tools, stop=["a"]
        )
        if stream:
            chunks = list(client.chat.completions.create(stream=True, **kwargs))
            deltas = [c.choices[0].delta for c in chunks if c.choices]
            content = "".join(d.content or "" for d in deltas)
            calls = [c.function for d in deltas for c in d.tool_calls or ()]
            finish = next(
                c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
            )
        else:
            choice = client.chat.completions.create(**kwargs).choices[0]
            content, finish = choice.message.content or "", choice.finish_reason
            calls = [c.function for c in choice.message.tool_calls or ()]  # type: ignore[misc]
        assert content == "Let me check." and finish == "tool_calls"
        assert calls and calls[0].name == "get_weather" and json.loads(calls[0].arguments or "") == ARGS
    claude = anthropic.Anthropic(base_url=scripted_server.url, api_key=API_KEY, max_retries=0)
    message = claude.messages.create(
        model=MODEL,
        max_tokens=200,
        messages=user("[[tool]] weather?"),
        tools=[{"name": "get_weather", "input_schema": FUNCTION["parameters"]}],  # type: ignore[list-item]
        stop_sequences=["a"],
    )
    assert message.stop_reason == "tool_use" and [b.type for b in message.content] == ["text", "tool_use"]
    cut = client.chat.completions.create(
        model=MODEL, messages=user("[[tool]] weather?"), tools=tools, stop=["che"]
    )
    assert cut.choices[0].message.content == "Let me" and cut.choices[0].finish_reason == "stop"
    assert not cut.choices[0].message.tool_calls


def test_legacy_functions_are_tools_and_answer_with_function_call(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=user("[[tool]] weather?"), functions=[FUNCTION]
    )  # type: ignore[list-item]
    choice = reply.choices[0]
    assert choice.finish_reason == "function_call" and choice.message.tool_calls is None
    call = choice.message.function_call
    assert call is not None and call.name == "get_weather" and json.loads(call.arguments) == ARGS
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=user("[[tool]] weather?"),
            functions=[FUNCTION],
            stream=True,  # type: ignore[list-item]
        )
    )
    calls = [
        c.choices[0].delta.function_call for c in chunks if c.choices and c.choices[0].delta.function_call
    ]
    assert [(c.name, json.loads(c.arguments or "")) for c in calls] == [("get_weather", ARGS)]
    assert chunks[-1].choices[0].finish_reason == "function_call"
    # function_call "none": the function is not offered, so the markup is not parsed as a call
    off = client.chat.completions.create(
        model=MODEL,
        messages=user("[[tool]] weather?"),
        functions=[FUNCTION],
        function_call="none",  # type: ignore[list-item]
    )
    assert off.choices[0].finish_reason == "stop" and "<tool_call>" in (off.choices[0].message.content or "")
    # history in the legacy shape: an assistant function_call and a function result
    history = [
        *user("[[tool]] weather?"),
        {"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": "{}"}},
        {"role": "function", "name": "get_weather", "content": "sunny"},
    ]
    after = client.chat.completions.create(model=MODEL, messages=history, functions=[FUNCTION])  # type: ignore[arg-type, list-item]
    assert after.choices[0].message.content == "It will be sunny in Paris."


def test_reasoning_effort_tiers_are_thinking_budgets(client: openai.OpenAI) -> None:
    full = SCRIPTS["overthink"][0].strip()
    capped = client.chat.completions.create(
        model=MODEL, messages=user("[[overthink]] q"), reasoning_effort="minimal"
    )
    message = capped.choices[0].message
    assert message.content == "Final answer."
    reasoning = message.reasoning_content  # type: ignore[attr-defined]
    assert full.startswith(reasoning) and len(reasoning) < len(full)
    assert 512 <= capped.usage.completion_tokens_details.reasoning_tokens <= 512 + 4  # type: ignore[union-attr]
    response = client.responses.create(model=MODEL, input="[[overthink]] q", reasoning={"effort": "minimal"})
    assert response.output_text == "Final answer."
    assert 512 <= response.usage.output_tokens_details.reasoning_tokens <= 512 + 4  # type: ignore[union-attr]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=user("q"), reasoning_effort="extreme")  # type: ignore[arg-type]
    assert info.value.body["param"] == "reasoning_effort"  # type: ignore[index]


# A tool call cut by the output limit (the `cut` script, thinking off: 43 answer tokens, then <|im_end|>).
# max_tokens -> (arguments text so far, complete arguments): 10 ends inside `<function=get`, the name
# unknown; 20 inside the city's value ("San" of "San Francisco"); 38 after the days parameter, before
# `</function>`; 41 after `</function>`: only `</tool_call>` is missing, so the call is whole.
CUTS: dict[int, tuple[str, dict[str, Any]] | None] = {
    10: None,
    20: ('{"city": "San', {}),
    38: ('{"city": "San Francisco", "days": 3', {"city": "San Francisco", "days": 3}),
    41: ('{"city": "San Francisco", "days": 3}', {"city": "San Francisco", "days": 3}),
}
CUT_ASK = user("[[cut]] weather?")
NO_THINKING = {"enable_thinking": False}


def _chat_cut(client: openai.OpenAI, max_tokens: int, stream: bool) -> tuple[str, list[tuple[str, str]], str]:
    kwargs: dict[str, Any] = dict(
        model=MODEL,
        messages=CUT_ASK,
        tools=[{"type": "function", "function": FUNCTION}],
        tool_choice="required" if stream else {"type": "function", "function": {"name": "get_weather"}},
        max_tokens=max_tokens,
        extra_body=NO_THINKING,
    )
    if not stream:
        choice = client.chat.completions.create(**kwargs).choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or ()]  # type: ignore[union-attr]
        return choice.message.content or "", calls, str(choice.finish_reason)
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    named: dict[int, list[str]] = {}
    for delta in deltas:
        for call in delta.tool_calls or ():
            name, args = named.setdefault(call.index, ["", ""])
            named[call.index] = [name + (call.function.name or ""), args + (call.function.arguments or "")]  # type: ignore[union-attr]
    finish = next(c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason)
    content = "".join(d.content or "" for d in deltas)
    return content, [(name, args) for name, args in named.values()], str(finish)


def test_a_tool_call_cut_by_max_tokens_is_a_truncated_call_on_chat(client: openai.OpenAI) -> None:
    """The call's markup is never the answer's text: a call whose name arrived comes back as a tool call whose
    arguments string is cut where the output limit cut it (OpenAI's own shape), with finish_reason "length";
    before the name, no call. Streamed and not agree (with tool_choice required / a named tool: the scripted
    engine ignores the grammar, the answer is the same)."""
    full = client.chat.completions.create(
        model=MODEL,
        messages=CUT_ASK,
        tools=[{"type": "function", "function": FUNCTION}],
        extra_body=NO_THINKING,
    )
    assert full.usage is not None and full.usage.completion_tokens == 44  # the cut points below rely on it
    for max_tokens, want in CUTS.items():
        for stream in (False, True):
            content, calls, finish = _chat_cut(client, max_tokens, stream)
            assert (max_tokens, stream, content, finish) == (max_tokens, stream, "Let me check.", "length")
            assert calls == ([] if want is None else [("get_weather", want[0])]), (max_tokens, stream)


def test_a_tool_call_cut_by_max_tokens_on_responses(client: openai.OpenAI) -> None:
    """Responses: the call is a `function_call` item whose `arguments` are the text so far and whose status
    is "incomplete" (the response's too, reason max_output_tokens); a call missing only `</tool_call>` is
    completed. Streamed events build the same items."""
    tool = {"type": "function", **FUNCTION}
    for max_tokens, want in CUTS.items():
        kwargs: dict[str, Any] = dict(
            model=MODEL,
            input="[[cut]] weather?",
            tools=[tool],
            max_output_tokens=max_tokens,
            extra_body=NO_THINKING,
        )
        plain = client.responses.create(**kwargs)
        events = list(client.responses.create(stream=True, **kwargs))
        streamed = events[-1].response  # type: ignore[union-attr]
        assert events[-1].type == "response.incomplete"
        deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")  # type: ignore[union-attr]
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
        for response in (plain, streamed):
            assert (
                response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
            )  # type: ignore[union-attr]
            assert response.output_text == "Let me check.", max_tokens
            calls = [(i.name, i.arguments, i.status) for i in response.output if i.type == "function_call"]
            if want is None:
                assert calls == [], max_tokens
                continue
            status = "completed" if want[0].endswith("}") else "incomplete"
            assert calls == [("get_weather", want[0], status)], max_tokens
        assert text == "Let me check." and deltas == ("" if want is None else want[0])


def test_a_tool_call_cut_by_max_tokens_on_messages(scripted_server: Server) -> None:
    """Anthropic Messages: stop_reason "max_tokens" with a tool_use block whose input holds the parameters
    whose values arrived whole (a value the limit cut is left out); no tool_use before the name; the
    markup is never text. The SDK's streamed message equals the plain one."""
    claude = anthropic.Anthropic(base_url=scripted_server.url, api_key=API_KEY, max_retries=0)
    tools = [{"name": "get_weather", "input_schema": FUNCTION["parameters"]}]
    for max_tokens, want in CUTS.items():
        kwargs: dict[str, Any] = dict(model=MODEL, max_tokens=max_tokens, messages=CUT_ASK, tools=tools)
        plain = claude.messages.create(**kwargs)
        with claude.messages.stream(**kwargs) as stream:
            streamed = stream.get_final_message()
        for message in (plain, streamed):
            assert message.stop_reason == "max_tokens", max_tokens
            blocks = [
                (b.type, getattr(b, "text", None), getattr(b, "name", None), getattr(b, "input", None))
                for b in message.content
            ]
            uses = [] if want is None else [("tool_use", None, "get_weather", want[1])]
            assert blocks == [("text", "Let me check.", None, None), *uses], max_tokens
