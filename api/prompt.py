"""Prompt side shared by every protocol: chat messages -> prompt text, token ids, checkpoint positions.

Each protocol's convert.py turns its own request into the chat template's message dicts (role, content,
reasoning_content, tool_calls, tool results as role `tool`) and calls `build_prompt`. Template errors
(`ChatTemplateError`) become 400s with the template's message.

Work is bounded by the context: given `max_context`, a prompt text far longer than the context could hold
is counted chunk by chunk first and refused (`PromptTooLong`) as soon as the count passes the context, so a
multi-MiB body costs about one context's worth of tokenization, not the whole body's. The routes run this
off the event loop (api.pipeline), so a large prompt never stalls other requests or the health probes.

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
from engine.media.prompt import PromptMedia
from engine.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str
    token_ids: list[int]
    checkpoint_positions: tuple[int, ...]  # message boundaries (after each `<|im_end|>\n`) and the end
    in_reasoning: bool  # the prompt opened `<think>`: generation starts inside the reasoning
    thinking: bool
    media: PromptMedia | None = None  # images / video (api/media.py attaches them after tokenizing)


def checkpoint_positions(token_ids: Sequence[int], im_end_id: int | None) -> tuple[int, ...]:
    """Token positions where a message ends, plus the prompt's end (the generation opener)."""
    n = len(token_ids)
    ends = [i + 2 for i, t in enumerate(token_ids) if t == im_end_id and i + 2 <= n]
    return tuple(sorted({*ends, n}))


CHUNK_CHARS = 1 << 16  # the bounded count tokenizes this many characters at a time
FULL_COUNT_CHARS_PER_TOKEN = 4  # texts up to this many chars per context token are tokenized directly


class PromptTooLong(ApiError):
    """The prompt cannot fit the context; `num_tokens` is a lower bound on its length."""

    def __init__(self, num_tokens: int, max_context: int, *, exact: bool = True, param: str = "messages"):
        size = f"{num_tokens}" if exact else f"at least {num_tokens}"
        super().__init__(
            400,
            "context_length_exceeded",
            f"the prompt has {size} tokens; this server's context is {max_context} tokens "
            "and must leave room for at least one output token",
            param=param,
        )
        self.num_tokens = num_tokens


def count_at_least(tokenizer: Tokenizer, text: str, limit: int) -> int | None:
    """A lower bound on the token count of `text` once it reaches `limit`, found by tokenizing chunks (cut
    at spaces, where the pre-tokenizer splits anyway) and stopping there; None if the text stays under."""
    count, start, num_chunks = 0, 0, 0
    while start < len(text):
        end = min(len(text), start + CHUNK_CHARS)
        if end < len(text):
            cut = text.rfind(" ", start + CHUNK_CHARS // 2, end)
            end = cut if cut > start else end
        count += len(tokenizer.encode(text[start:end]))
        num_chunks += 1
        if count - num_chunks >= limit:  # each cut can add at most one token
            return count - num_chunks
        start = end
    return None


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
    max_context: int | None = None,
) -> Prompt:
    """Render and tokenize. `prefill`: the last message is an assistant turn to be continued. With
    `max_context`, a text much longer than the context is refused (`PromptTooLong`) before it is tokenized
    whole."""
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
    if max_context is not None and len(text) > FULL_COUNT_CHARS_PER_TOKEN * max_context:
        at_least = count_at_least(tokenizer, text, max_context)
        if at_least is not None:
            raise PromptTooLong(at_least, max_context, exact=False, param=param)
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
        raise PromptTooLong(len(prompt.token_ids), max_context)
