"""Overlap scheduling through real HTTP: the session's `real_server` runs `ninfer-serve --overlap` on the demo
model, and the official openai SDK streams from it. A request with logprobs takes the synchronous step (its
tokens are needed on the host before the next step), so a streamed answer with and without them compares
overlap with no overlap on the same server."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from api_helpers import Server


@pytest.fixture(scope="module")
def real(real_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{real_server.url}/v1", api_key="unused")


def _stream(client: openai.OpenAI, **kwargs: Any) -> tuple[str, str | None, int]:
    """(reasoning + content text, finish reason, completion tokens) of one streamed chat completion."""
    chunks = list(
        client.chat.completions.create(
            model="tiny-alias",
            messages=[{"role": "user", "content": "Tell me about the sea and the ships."}],
            temperature=0.0,
            reasoning_effort="none",  # thinking off: stop strings match the answer, which is all of it
            stream=True,
            stream_options={"include_usage": True},
            **kwargs,
        )
    )
    text = "".join(
        ((c.choices[0].delta.model_extra or {}).get("reasoning_content") or "")
        + (c.choices[0].delta.content or "")
        for c in chunks
        if c.choices
    )
    finish = next(
        (c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason), None
    )
    return text, finish, chunks[-1].usage.completion_tokens


def test_streamed_answers_match_the_synchronous_step_through_the_sdk(
    real: openai.OpenAI, real_server: Server
) -> None:
    engine = httpx.get(f"{real_server.url}/stats", timeout=10).json()["engine"]
    assert engine["overlap"] is True and engine["num_preemptions"] == 0
    overlapped = _stream(real, max_tokens=12)
    synchronous = _stream(real, max_tokens=12, logprobs=True, top_logprobs=1)
    assert overlapped == synchronous and overlapped[1] == "length" and overlapped[2] == 12
    text = overlapped[0]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    cut = _stream(real, max_tokens=12, stop=[stop])
    assert cut == _stream(real, max_tokens=12, stop=[stop], logprobs=True, top_logprobs=1)
    assert cut[1] == "stop" and stop not in cut[0] and text.startswith(cut[0])
