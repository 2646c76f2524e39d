"""Prompt side shared by every protocol: chat messages -> prompt text, token ids, checkpoint positions.

Each protocol's convert.py turns its own request into the chat template's message dicts (role, content,
reasoning_content, tool_calls, tool results as role `tool`) and calls `build_prompt`. Template errors
(`ChatTemplateError`) become 400s with the template's message.

System text: the chat template takes one system turn, first. OpenAI clients may send several system or
developer messages, anywhere; `build_prompt` joins their texts, in order and separated by a blank line, into
that first turn (as Responses joins `instructions` with its system items).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from api.errors import ApiError, invalid
from engine.chat import ChatTemplateError, prompt_ends_in_reasoning
from engine.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str
    token_ids: list[int]
    checkpoint_positions: tuple[int, ...]  # message boundaries (after each `<|im_end|>\n`) and the end
    in_reasoning: bool  # the prompt opened `<think>`: generation starts inside the reasoning
    thinking: bool


def checkpoint_positions(token_ids: Sequence[int], im_end_id: int | None) -> tuple[int, ...]:
    """Token positions where a message ends, plus the prompt's end (the generation opener)."""
    n = len(token_ids)
    ends = [i + 2 for i, t in enumerate(token_ids) if t == im_end_id and i + 2 <= n]
    return tuple(sorted({*ends, n}))


def merge_system_messages(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """One leading system message holding every system / developer text, in order; the rest unchanged."""
    system = [m for m in messages if m.get("role") in ("system", "developer")]
    if len(system) < 2 and (not system or messages[0] is system[0]):
        return list(messages)
    texts = [m.get("content") for m in system]
    if not all(isinstance(t, str) for t in texts):
        return list(messages)  # structured content: leave it to the template's own check
    joined = "\n\n".join(t for t in texts if t)
    rest = [m for m in messages if m.get("role") not in ("system", "developer")]
    return [{"role": "system", "content": joined}, *rest]


def build_prompt(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None,
    thinking: bool,
    preserve_thinking: bool,
    prefill: bool = False,
    param: str = "messages",
) -> Prompt:
    """Render and tokenize. `prefill`: the last message is an assistant turn to be continued."""
    messages = merge_system_messages(messages)
    try:
        text = tokenizer.apply_chat_template(
            messages,
            tools=tools or None,
            add_generation_prompt=not prefill,
            enable_thinking=thinking,
            preserve_thinking=preserve_thinking,
            continue_final_message=prefill,
        )
    except ChatTemplateError as exc:
        raise invalid(str(exc), param=param) from None
    ids = tokenizer.encode(text)
    if not ids:
        raise invalid("the prompt is empty", param=param)
    return Prompt(
        text=text,
        token_ids=ids,
        checkpoint_positions=checkpoint_positions(ids, tokenizer.special_ids.im_end_id),
        in_reasoning=prompt_ends_in_reasoning(text),
        thinking=thinking,
    )


def check_fits(prompt: Prompt, max_context: int) -> None:
    """A prompt must leave room for at least one output token."""
    if len(prompt.token_ids) >= max_context:
        raise ApiError(
            400,
            "context_length_exceeded",
            f"the prompt has {len(prompt.token_ids)} tokens; this server's context is {max_context} tokens "
            "and must leave room for at least one output token",
            param="messages",
        )
