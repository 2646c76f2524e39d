"""Our Qwen3.5 chat template renders the published chat format, exactly, in our renderer and in
transformers' own `apply_chat_template` environment."""

from __future__ import annotations

from typing import Any

import pytest

from engine.chat import ChatTemplateError, qwen35, render_chat_template

TEMPLATE = qwen35.qwen35_chat_template()

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city <b>&",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}

TOOLS_PREAMBLE = (
    "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city <b>&", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, '
    '"required": ["city"]}}}\n</tools>\n\n'
    "If you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be "
    "nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the function "
    "call, but NOT after\n"
    "- If there is no function call available, answer the question like normal with your current knowledge "
    "and do not tell the user about function calls\n</IMPORTANT>"
)


def render(messages: list[dict[str, Any]], **kwargs: Any) -> str:
    return render_chat_template(TEMPLATE, messages, **kwargs)


def test_plain_chat_with_generation_prompt_opens_thinking() -> None:
    got = render([{"role": "user", "content": "What is 2+2?"}])
    assert got == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n"


def test_thinking_off_renders_the_empty_think_block() -> None:
    got = render([{"role": "user", "content": "What is 2+2?"}], enable_thinking=False)
    assert got == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_no_generation_prompt() -> None:
    got = render([{"role": "user", "content": "hi"}], add_generation_prompt=False)
    assert got == "<|im_start|>user\nhi<|im_end|>\n"


@pytest.mark.parametrize("role", ["system", "developer"])
def test_system_prompt_is_trimmed_and_first(role: str) -> None:
    got = render([{"role": role, "content": "  You are terse.\n"}, {"role": "user", "content": " hi "}])
    expected = "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    assert got == expected + "<|im_start|>assistant\n<think>\n"


HISTORY = [
    {"role": "user", "content": "First?"},
    {"role": "assistant", "content": "One.", "reasoning_content": "\nthink one\n"},
    {"role": "user", "content": "Second?"},
    {"role": "assistant", "content": "<think>\nthink two\n</think>\n\nTwo."},
]


def test_history_reasoning_dropped_before_last_query_by_default() -> None:
    got = render(HISTORY, add_generation_prompt=False)
    assert got == (
        "<|im_start|>user\nFirst?<|im_end|>\n"
        "<|im_start|>assistant\nOne.<|im_end|>\n"
        "<|im_start|>user\nSecond?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nthink two\n</think>\n\nTwo.<|im_end|>\n"
    )


def test_preserve_thinking_keeps_every_turns_reasoning() -> None:
    got = render(HISTORY, add_generation_prompt=False, preserve_thinking=True)
    assert got == (
        "<|im_start|>user\nFirst?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nthink one\n</think>\n\nOne.<|im_end|>\n"
        "<|im_start|>user\nSecond?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nthink two\n</think>\n\nTwo.<|im_end|>\n"
    )


def test_preserved_turn_is_a_prefix_of_the_next_prompt() -> None:
    """With preserve_thinking, the next turn's prompt extends the previous prompt plus its output."""
    first = render(HISTORY[:1], preserve_thinking=True)
    generated = "think one\n</think>\n\nOne.<|im_end|>\n"
    second = render([*HISTORY[:2], {"role": "user", "content": "Again?"}], preserve_thinking=True)
    assert second.startswith(first + generated)


def test_reasoning_field_aliases() -> None:
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning": "r"}]
    got = render(messages, add_generation_prompt=False)
    assert got.endswith("<|im_start|>assistant\n<think>\nr\n</think>\n\na<|im_end|>\n")


def test_tools_tool_calls_and_tool_results() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Two calls.",
            "tool_calls": [
                {
                    "id": "a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'},
                },
                {
                    "id": "b",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Rome", "extra": [1, "é"]}},
                },
            ],
        },  # fmt: skip
        {"role": "tool", "tool_call_id": "a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "b", "content": "rain"},
    ]
    got = render(messages, tools=[WEATHER])
    assert got == (
        TOOLS_PREAMBLE + "\n\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nTwo calls.\n</think>\n\nChecking.\n\n"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
        '<parameter=extra>\n[1, "é"]\n</parameter>\n</function>\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrain\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )


def test_tool_call_without_content_and_tools_without_system() -> None:
    messages = [
        {"role": "user", "content": "Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny"},
    ]  # fmt: skip
    got = render(messages, tools=[WEATHER], enable_thinking=False)
    assert got == (
        TOOLS_PREAMBLE + "<|im_end|>\n"
        "<|im_start|>user\nParis?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_image_and_video_parts() -> None:
    content = [
        {"type": "text", "text": "Compare "},
        {"type": "image_url", "image_url": {"url": "x"}},
        {"type": "video"},
    ]
    got = render([{"role": "user", "content": content}], add_generation_prompt=False, add_vision_id=True)
    assert got == (
        "<|im_start|>user\nCompare Picture 1: <|vision_start|><|image_pad|><|vision_end|>"
        "Video 1: <|vision_start|><|video_pad|><|vision_end|><|im_end|>\n"
    )


def test_continue_final_message_is_a_prefill() -> None:
    messages = [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi, I am"}]
    got = render(messages, add_generation_prompt=False, continue_final_message=True, enable_thinking=False)
    assert got == "<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHi, I am"


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([], "No messages provided."),
        ([{"role": "system", "content": "s"}], "No user query found in messages."),
        ([{"role": "user", "content": "a"}, {"role": "system", "content": "s"}], "System message must be at the beginning."),
        ([{"role": "critic", "content": "a"}, {"role": "user", "content": "b"}], "Unexpected message role."),
        ([{"role": "user", "content": {"text": "a"}}], "Message content must be a string or a list of parts."),
        ([{"content": "no role"}], "must be an object with a string 'role'"),
        ([{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}], "not valid JSON"),
    ],
)  # fmt: skip
def test_bad_conversations_raise_chat_template_error(messages: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ChatTemplateError, match=message):
        render(messages)
    assert issubclass(ChatTemplateError, ValueError)


def test_messages_are_not_mutated() -> None:
    call = {"function": {"name": "get_weather", "arguments": '{"city": "X"}'}}
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    render(messages, tools=[WEATHER])
    assert call == {"function": {"name": "get_weather", "arguments": '{"city": "X"}'}}


def test_transformers_environment_renders_the_same() -> None:
    from transformers.utils.chat_template_utils import render_jinja_template

    conversations: list[tuple[list[dict[str, Any]], dict[str, Any]]] = [
        ([{"role": "user", "content": "hi"}], {}),
        ([{"role": "system", "content": "S"}, *HISTORY], {"preserve_thinking": True}),
        (HISTORY, {"enable_thinking": False}),
        (
            [
                {"role": "user", "content": "Paris?"},
                {"role": "assistant", "content": "ok", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "P", "days": 3}}}]},
                {"role": "tool", "content": "sunny"},
            ],
            {"tools": [WEATHER]},
        ),
    ]  # fmt: skip
    for messages, kwargs in conversations:
        ours = render(messages, **kwargs)
        theirs, _ = render_jinja_template(
            conversations=[messages], chat_template=TEMPLATE, add_generation_prompt=True, **kwargs
        )
        assert theirs == [ours]
