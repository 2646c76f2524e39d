"""The one generation pipeline behind the three generation routes (Chat Completions, Responses, Messages).

A route parses and converts its own request into a `Turn` (chat messages, tools, sampling, what the request
log records) and hands it to `run()` with its protocol's `Adapter`. `run()` does the rest, the same for
every protocol: build the prompt, open the request's `Tracker` (request log, metrics, span), refuse a prompt
that does not fit the context, submit to the engine (`Generation`), then answer either one JSON body
(`Adapter.body`) or an SSE stream whose frames come from the adapter and whose endings (an engine error, a
server abort) are handled here once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields, replace
from functools import partial
from typing import Any, Protocol, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from api import structured
from api.errors import ApiError
from api.generation import Generation, Outcome
from api.media import media_refs, prompt_with_media
from api.prompt import Prompt, PromptTooLong, build_prompt, check_fits
from api.sse import with_keepalive
from api.state import ServerState
from api.tracking import ClientDisconnected, Tracker, collect, wait_disconnect
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
    max_tokens: int  # the output limit (>= 1)
    stream: bool
    parse_tools: list[dict[str, Any]] | None = None  # tool calls are parsed against these (default: tools)
    prefill: bool = False  # the last message is an assistant turn to continue
    prompt_param: str = "messages"  # the field a prompt error names
    thinking_budget: int | None = None
    log_fields: Mapping[str, Any] = field(default_factory=dict)  # protocol-specific request_start fields
    n: int = 1  # choices (Chat `n`): the others reuse the first one's prompt KV

    @classmethod
    def from_plan(cls, plan: object, **given: Any) -> Turn:
        """A turn from a route's converted request: every `Turn` field the plan has (messages, tools,
        thinking, params, ...), then `given` (protocol, stream, log_fields and what the route sets itself)."""
        planned = {f.name: getattr(plan, f.name) for f in fields(cls) if hasattr(plan, f.name)}
        return cls(**{**planned, **given})


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


# Chat templates and tokenizers run here, off the event loop; a few workers bound the memory that large
# prompts can hold at once (the rest wait their turn).
_PROMPT_WORKERS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="ninfer-prompt")

T = TypeVar("T")


async def off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run `fn` on a prompt worker (chat template, tokenizer) and await it."""
    return await asyncio.get_running_loop().run_in_executor(_PROMPT_WORKERS, partial(fn, *args, **kwargs))


def _tracker(state: ServerState, request_id: str, turn: Turn, num_prompt_tokens: int) -> Tracker:
    return Tracker(
        state,
        request_id,
        turn.protocol,
        **turn.log_fields,
        stream=turn.stream,
        num_tools=len(turn.tools or ()),
        thinking=turn.thinking,
        max_tokens=turn.max_tokens,
        prompt_tokens=num_prompt_tokens,
    )


async def run(state: ServerState, request: Request, turn: Turn, adapter: Adapter) -> Response:
    """Prompt -> tracker -> context check -> engine -> the answer in the adapter's protocol."""
    request_id: str = request.state.request_id
    try:
        prompt = await off_loop(
            build_prompt,
            state.engine.tokenizer,
            turn.messages,
            tools=turn.tools,
            thinking=turn.thinking,
            preserve_thinking=turn.preserve_thinking,
            prefill=turn.prefill,
            param=turn.prompt_param,
            max_context=state.max_context,
        )
    except PromptTooLong as exc:  # refused before it was tokenized whole
        _tracker(state, request_id, turn, exc.num_tokens).rejected(exc)
        raise
    tracker = _tracker(state, request_id, turn, len(prompt.token_ids))
    params = turn.params
    try:
        prompt = await _with_media(state, turn, prompt)
        check_fits(prompt, state.max_context)
        if params.structured is not None:  # the grammar's reasoning phase follows the prompt
            params = replace(params, structured=replace(params.structured, in_reasoning=prompt.in_reasoning))
            await structured.check(state.engine, params.structured)
    except ApiError as exc:
        tracker.rejected(exc)
        raise
    generation = Generation(
        state.engine,
        request_id,
        prompt,
        params,
        tools=turn.parse_tools if turn.parse_tools is not None else turn.tools,
        calls_in_reasoning=state.options.tolerant_tool_calls,
        thinking_budget=turn.thinking_budget,
    )
    await _begin(tracker, generation, request)
    if turn.n > 1 and not turn.stream:
        return JSONResponse(await _many(state, request, turn, params, tracker, generation, adapter))
    if not turn.stream:
        events = await collect(tracker, generation, request)
        return JSONResponse(adapter.body(events, generation.outcome))
    if turn.n > 1:
        try:
            extras = await _start_extras(state, turn, params, generation)
        except BaseException as exc:
            _extras_failed(tracker, generation, exc)
            raise
        frames = _frames_many([generation, *extras], adapter)
    else:
        frames = _frames(generation, adapter)
    body = with_keepalive(tracker.stream(generation, frames), state.options.keepalive_seconds)
    return StreamingResponse(body, media_type="text/event-stream", headers=SSE_HEADERS)


async def _with_media(state: ServerState, turn: Turn, prompt: Prompt) -> Prompt:
    """The prompt with its images / video prepared and their placeholders expanded (api/media.py)."""
    if not media_refs(turn.messages):
        return prompt
    return await off_loop(prompt_with_media, state.engine, turn.messages, prompt)


async def _start_extras(
    state: ServerState, turn: Turn, params: SamplingParams, first: Generation
) -> list[Generation]:
    """Choices 1..n-1 of `first`'s prompt, submitted once the first one was admitted: its prompt is then in
    the prefix index, so each of them prefills nothing but the prompt's partial last page. A seeded request
    gives choice i the seed + i."""
    first.read_ahead()  # its stop strings end it while the others wait for a lane
    extras = [
        Generation(
            state.engine,
            f"{first.request_id}-{i}",
            first.prompt,
            replace(params, seed=None if params.seed is None else (params.seed + i) % 2**63),
            tools=turn.parse_tools if turn.parse_tools is not None else turn.tools,
            calls_in_reasoning=state.options.tolerant_tool_calls,
            thinking_budget=turn.thinking_budget,
        )  # fmt: skip
        for i in range(1, turn.n)
    ]
    try:
        for generation in extras:
            await generation.start()
            generation.read_ahead()
    except BaseException:
        for generation in extras:
            generation.abort()
        raise
    return extras


def _extras_failed(tracker: Tracker, first: Generation, exc: BaseException) -> None:
    """Choices 1..n-1 could not start: the first choice is aborted. An engine refusal of a later choice
    (overloaded, queue timeout) is the request's answer, so the request counts as rejected with that code,
    not as the first choice's ending; a client that left while they queued counts as disconnected."""
    first.abort()
    if isinstance(exc, ApiError) and not isinstance(exc, ClientDisconnected):
        tracker.refused(exc)
    else:
        tracker.finish(first, exc)


async def _many(
    state: ServerState,
    request: Request,
    turn: Turn,
    params: SamplingParams,
    tracker: Tracker,
    first: Generation,
    adapter: Adapter,
) -> dict[str, Any]:
    """`turn.n` choices of one prompt, in one body. The request log and metrics see the first choice."""
    try:
        extras = await _start_extras(state, turn, params, first)
    except BaseException as exc:
        _extras_failed(tracker, first, exc)
        raise
    try:
        results = await asyncio.gather(collect(tracker, first, request), *(_events(g) for g in extras))
    finally:
        for generation in extras:
            generation.abort()
    many = getattr(adapter, "body_many", None)
    assert many is not None, "n > 1 needs an adapter with body_many"
    body: dict[str, Any] = many(
        [(events, g.outcome) for events, g in zip(results, [first, *extras], strict=True)]
    )
    return body


async def _events(generation: Generation) -> list[StreamEvent]:
    events = [event async for event in generation.events()]
    if generation.outcome.finish == "aborted":
        raise aborted_error()
    return events


async def _begin(tracker: Tracker, generation: Generation, request: Request) -> None:
    """Submit and wait for admission (`Tracker.begin`) while watching the connection: a client that goes
    away while its request is queued gives its pending place back at once (the engine request is aborted)."""
    begin = asyncio.ensure_future(tracker.begin(generation))
    gone = asyncio.ensure_future(wait_disconnect(request))
    try:
        await asyncio.wait((begin, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this handler itself is cancelled
        for task in (gone, begin):
            if not task.done():
                task.cancel()
        await asyncio.gather(gone, begin, return_exceptions=True)
    if begin.cancelled():  # the client left first
        generation.abort()
        error = ClientDisconnected()
        tracker.rejected(error)
        raise error
    begin.result()  # an engine refusal is raised here (already logged by the tracker)


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


_CHOICE_DONE = object()


async def _frames_many(generations: list[Generation], adapter: Adapter) -> AsyncIterator[str]:
    """n streamed choices, interleaved as their events come: each choice's frames from its own adapter
    (`adapter.choice(i)`: its chunks carry its index, it ends with its own finish reason), then the usage of
    all choices and the terminator (`adapter.closing_many`). A choice the engine could not finish ends the
    whole stream (`adapter.failed`). Closing this iterator (client gone) aborts every choice."""
    choice = getattr(adapter, "choice", None)
    assert choice is not None, "n > 1 streamed needs an adapter with choice / choice_closing / closing_many"
    queue: asyncio.Queue[Any] = asyncio.Queue()

    async def pump(generation: Generation, one: Any) -> None:
        try:
            for frame in one.opening(generation.outcome):
                await queue.put(frame)
            async for event in generation.events():
                for frame in one.frames(event):
                    await queue.put(frame)
            if generation.outcome.finish == "aborted":
                raise aborted_error()
            for frame in one.choice_closing(generation.outcome):
                await queue.put(frame)
            await queue.put(_CHOICE_DONE)
        except Exception as exc:  # an ApiError ends the stream in the protocol's shape; anything else raises
            await queue.put(exc)

    tasks = [asyncio.ensure_future(pump(g, choice(i))) for i, g in enumerate(generations)]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is _CHOICE_DONE:
                remaining -= 1
            elif isinstance(item, ApiError):
                for frame in adapter.failed(item):
                    yield frame
                return
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
        for frame in adapter.closing_many([g.outcome for g in generations]):  # type: ignore[attr-defined]
            yield frame
    finally:
        for task in tasks:
            task.cancel()
        for generation in generations[1:]:  # the tracker aborts the first one
            generation.abort()
