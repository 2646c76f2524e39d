"""One streamed request through the official `openai` or `anthropic` SDK, timed chunk by chunk.

No locust import: the profiles call these from Locust users, and tests can call them directly.
Every chunk that carries generated text (content, reasoning or a tool-call delta) counts as a token
arrival for TTFT and ITL; output, prompt and cached prompt token counts come from the server's usage.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import anthropic
import openai


@dataclass(slots=True)
class StreamResult:
    start: float  # wall clock (time.time()) at send
    ttft_s: float | None = None
    e2e_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)  # gaps between token-carrying chunks
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: str | None = None
    text: str = ""  # content only (reasoning is not carried into the next turn)

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


class _Clock:
    def __init__(self, result: StreamResult) -> None:
        self.result = result
        self.t0 = time.perf_counter()
        self.last: float | None = None

    def token(self) -> None:
        now = time.perf_counter()
        if self.last is None:
            self.result.ttft_s = now - self.t0
        else:
            self.result.itl_s.append(now - self.last)
        self.last = now

    def done(self) -> None:
        self.result.e2e_s = time.perf_counter() - self.t0


def stream_openai(
    client: openai.OpenAI,
    model: str,
    messages: list[dict[str, Any]],
    max_tokens: int,
    **extra: Any,
) -> StreamResult:
    """Chat Completions with `stream=True` and `stream_options.include_usage`."""
    result = StreamResult(start=time.time())
    clock = _Clock(result)
    stream = client.chat.completions.create(
        model=model,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        **extra,
    )
    parts: list[str] = []
    with stream:
        for chunk in stream:
            for choice in chunk.choices:
                delta = choice.delta
                reasoning = (delta.model_extra or {}).get("reasoning_content")
                if delta.content or reasoning or delta.tool_calls:
                    clock.token()
                if delta.content:
                    parts.append(delta.content)
                if choice.finish_reason:
                    result.finish_reason = choice.finish_reason
            if chunk.usage is not None:
                result.output_tokens = chunk.usage.completion_tokens
                result.prompt_tokens = chunk.usage.prompt_tokens
                details = chunk.usage.prompt_tokens_details
                result.cached_tokens = (details.cached_tokens or 0) if details is not None else 0
    clock.done()
    result.text = "".join(parts)
    return result


def stream_anthropic(
    client: anthropic.Anthropic,
    model: str,
    messages: list[dict[str, Any]],
    max_tokens: int,
    *,
    system: str | None = None,
    **extra: Any,
) -> StreamResult:
    """Messages with `stream=True`; prompt tokens = input + cache read + cache creation."""
    result = StreamResult(start=time.time())
    clock = _Clock(result)
    kwargs: dict[str, Any] = {"system": system} if system else {}
    stream = client.messages.create(
        model=model,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        stream=True,
        **kwargs,
        **extra,
    )
    parts: list[str] = []
    usage: Any = None
    with stream:
        for event in stream:
            if event.type == "message_start":
                usage = event.message.usage
            elif event.type == "content_block_delta":
                delta: Any = event.delta
                if delta.type in ("text_delta", "thinking_delta", "input_json_delta"):
                    clock.token()
                if delta.type == "text_delta":
                    parts.append(delta.text)
            elif event.type == "message_delta":
                usage = event.usage
                result.finish_reason = event.delta.stop_reason
    clock.done()
    if usage is not None:
        cached = getattr(usage, "cache_read_input_tokens", None) or 0
        created = getattr(usage, "cache_creation_input_tokens", None) or 0
        result.output_tokens = usage.output_tokens or 0
        result.prompt_tokens = (usage.input_tokens or 0) + cached + created
        result.cached_tokens = cached
    result.text = "".join(parts)
    return result
