"""The one generation pipeline behind the three generation routes (Chat Completions, Responses, Messages).

A route parses and converts its own request into a `Turn` (chat messages, tools, sampling, what the request
log records) and hands it to `run()` with its protocol's `Adapter`. `run()` does the rest, the same for
every protocol: build the prompt, open the request's `Tracker` (request log, metrics, span), refuse a prompt
that does not fit the context, submit to the engine (`Generation`), then answer either one JSON body
(`Adapter.body`) or an SSE stream whose frames come from the adapter and whose endings (an engine error, a
server abort) are handled here once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from api.errors import ApiError
from api.generation import Generation, Outcome
from api.prompt import Prompt, build_prompt, check_fits
from api.sse import with_keepalive
from api.state import ServerState
from api.tracking import Tracker, collect
from engine.chat.parse import StreamEvent
from engine.request import SamplingParams

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass(frozen=True, slots=True)
class Turn:
    """One generation request as its protocol hands it over."""

    protocol: str  # the request log's and the metrics' protocol label ("chat.completions", ...)
    messages: list[dict[str, Any]]  # chat template messages
    tools: list[dict[str, Any]] | None  # rendered into the prompt
    thinking: bool
    preserve_thinking: bool
    params: SamplingParams
    max_tokens: int  # as requested (0 = prompt only: answered without an engine request)
    stream: bool
    parse_tools: list[dict[str, Any]] | None = None  # tool calls are parsed against these (default: tools)
    prefill: bool = False  # the last message is an assistant turn to continue
    prompt_param: str = "messages"  # the field a prompt error names
    thinking_budget: int | None = None
    log_fields: Mapping[str, Any] = field(default_factory=dict)  # protocol-specific request_start fields


class Adapter(Protocol):
    """A protocol's output side: the non-streamed body and the SSE frames of a streamed answer."""

    def body(self, events: list[StreamEvent], outcome: Outcome) -> dict[str, Any]:
        """The whole answer of a non-streamed request."""
        ...

    def opening(self, outcome: Outcome) -> list[str]:
        """Frames sent before the first generated event."""
        ...

    def frames(self, event: StreamEvent) -> list[str]:
        """Frames for one parsed event (reasoning, content or a tool call)."""
        ...

    def failed(self, error: ApiError) -> list[str]:
        """Frames that end a stream the engine could not finish."""
        ...

    def closing(self, outcome: Outcome) -> list[str]:
        """Frames that end a finished stream (finish reason, usage, terminator)."""
        ...


def aborted_error() -> ApiError:
    return ApiError(503, "request_aborted", "the request was aborted by the server")


def prompt_of(state: ServerState, turn: Turn) -> Prompt:
    return build_prompt(
        state.engine.tokenizer,
        turn.messages,
        tools=turn.tools,
        thinking=turn.thinking,
        preserve_thinking=turn.preserve_thinking,
        prefill=turn.prefill,
        param=turn.prompt_param,
    )


async def run(state: ServerState, request: Request, turn: Turn, adapter: Adapter) -> Response:
    """Prompt -> tracker -> context check -> engine -> the answer in the adapter's protocol."""
    prompt = prompt_of(state, turn)
    request_id: str = request.state.request_id
    tracker = Tracker(
        state,
        request_id,
        turn.protocol,
        **turn.log_fields,
        stream=turn.stream,
        num_tools=len(turn.tools or ()),
        thinking=turn.thinking,
        max_tokens=turn.max_tokens,
        prompt_tokens=len(prompt.token_ids),
    )
    try:
        check_fits(prompt, state.max_context)
    except ApiError as exc:
        tracker.rejected(exc)
        raise
    if turn.max_tokens == 0:  # prompt only: nothing to generate
        outcome = Outcome(finish="length", prompt_tokens=len(prompt.token_ids))
        return JSONResponse(adapter.body([], outcome))
    generation = Generation(
        state.engine,
        request_id,
        prompt,
        turn.params,
        tools=turn.parse_tools if turn.parse_tools is not None else turn.tools,
        calls_in_reasoning=state.options.tolerant_tool_calls,
        thinking_budget=turn.thinking_budget,
    )
    await tracker.begin(generation)
    if not turn.stream:
        events = await collect(tracker, generation, request)
        return JSONResponse(adapter.body(events, generation.outcome))
    frames = _frames(generation, adapter)
    body = with_keepalive(tracker.stream(generation, frames), state.options.keepalive_seconds)
    return StreamingResponse(body, media_type="text/event-stream", headers=SSE_HEADERS)


async def _frames(generation: Generation, adapter: Adapter) -> AsyncIterator[str]:
    for frame in adapter.opening(generation.outcome):
        yield frame
    try:
        async for event in generation.events():
            for frame in adapter.frames(event):
                yield frame
    except ApiError as exc:
        for frame in adapter.failed(exc):
            yield frame
        return
    outcome = generation.outcome
    for frame in adapter.failed(aborted_error()) if outcome.finish == "aborted" else adapter.closing(outcome):
        yield frame
