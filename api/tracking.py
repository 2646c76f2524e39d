"""Per-request bookkeeping shared by the protocols: in-flight counts, totals and the request log events."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request

from api.errors import ApiError, anthropic_status
from api.generation import Generation
from api.request_log import shorten
from api.state import ServerState
from engine.chat.parse import StreamEvent
from monitor.collect import observe_request

logger = logging.getLogger("ninfer.api")


class Tracker:
    def __init__(self, state: ServerState, request_id: str, protocol: str, **fields: Any) -> None:
        self.state = state
        self.request_id = request_id
        self.protocol = protocol
        self._open = False
        fields = shorten(fields)  # a multi-MiB label is cut for the log and the span
        self.span = (
            state.tracing.start(protocol, request_id, fields, state.served_model_id)
            if state.tracing is not None
            else None
        )
        state.num_requests += 1
        state.log("request_start", request_id=request_id, protocol=protocol, **fields)

    def rejected(self, error: ApiError, phase: str = "prepare") -> None:
        if self.span is not None:
            self.span.rejected(error)
        self.state.num_errors += 1
        observe_request(
            self.state.metrics, {"event": "request_rejected", "protocol": self.protocol, "code": error.code}
        )
        self.state.log(
            "request_rejected",
            request_id=self.request_id,
            protocol=self.protocol,
            phase=phase,
            status=anthropic_status(error) if self.protocol == "anthropic.messages" else error.status,
            code=error.code,
            param=error.param,
            message=error.message,
        )

    async def begin(self, generation: Generation) -> None:
        """Submit to the engine; a refusal is logged and re-raised as the HTTP error."""
        if self.span is not None:
            self.span.sampling(generation.params)
        try:
            await generation.start()
        except ApiError as exc:
            self.rejected(exc)
            raise
        self._open = True
        self.state.in_flight += 1
        self.state.max_in_flight = max(self.state.max_in_flight, self.state.in_flight)

    def refused(self, error: ApiError) -> None:
        """An admitted request answered with `error` after all (n > 1: a later choice was refused): closes
        its in-flight count and records it as rejected, as a request refused before admission is."""
        if self._open:
            self._open = False
            self.state.in_flight -= 1
        self.rejected(error, phase="admission")

    def finish(self, generation: Generation, error: BaseException | None = None) -> None:
        if not self._open:
            return
        self._open = False
        state = self.state
        state.in_flight -= 1
        outcome = generation.outcome
        state.prompt_tokens_total += outcome.prompt_tokens
        state.completion_tokens_total += outcome.completion_tokens
        disconnected = isinstance(error, GeneratorExit | asyncio.CancelledError | ClientDisconnected)
        if error is not None and not disconnected:
            state.num_errors += 1
            state.log(
                "request_error",
                request_id=self.request_id,
                protocol=self.protocol,
                error_type=type(error).__name__,
                message=str(error)[:500],
            )
        finish = "client_disconnected" if disconnected else outcome.finish
        record: dict[str, Any] = dict(
            protocol=self.protocol,
            result={
                "finish_reason": finish,
                "prompt_tokens": outcome.prompt_tokens,
                "completion_tokens": outcome.completion_tokens,
                "reasoning_tokens": outcome.reasoning_tokens,
                "prefix_cache_hit_tokens": outcome.cached_tokens,
                "host_cache_hit_tokens": outcome.host_cached_tokens,
                "prefix_reuse_path": _reuse_path(outcome.cached_tokens, outcome.host_cached_tokens),
                "stop_sequence_matched": outcome.stop_sequence is not None,
                "tool_call_parse": {"fallbacks": list(outcome.tool_parse_fallbacks)},
            },
            timings_seconds=outcome.timings(),
        )
        if outcome.speculative is not None:  # upstream's request-log block; feeds ninfer_spec_decode_*
            record["speculative"] = dataclasses.asdict(outcome.speculative)
        observe_request(state.metrics, {"event": "request_done", **record})
        state.log("request_done", request_id=self.request_id, **record)
        if self.span is not None:
            self.span.finish(record, outcome, None if disconnected else error)

    async def stream(self, generation: Generation, frames: AsyncIterator[str]) -> AsyncIterator[str]:
        """Pass the SSE frames through; log the ending however the stream ends (disconnect included)."""
        error: BaseException | None = None
        try:
            async for frame in frames:
                yield frame
        except BaseException as exc:  # logged, then re-raised: cancellation and disconnects end here too
            error = exc
            raise
        finally:
            generation.abort()
            self.finish(generation, error)


async def collect(
    tracker: Tracker, generation: Generation, request: Request | None = None
) -> list[StreamEvent]:
    """Run a non-streamed generation to its end; an abort by the server is a 503.

    With `request`, the connection is watched while the engine works: a client that goes away aborts the
    engine request at once (its lane is freed at the next engine step, as for a cut stream), the request
    log records `client_disconnected`, and the answer (never delivered) is a 499.
    """
    error: BaseException | None = None
    try:
        if request is None:
            events = [event async for event in generation.events()]
        else:
            events = await _unless_disconnected(request, generation)
    except BaseException as exc:
        error = exc
        raise
    finally:
        generation.abort()
        tracker.finish(generation, error)
    if generation.outcome.finish == "aborted":
        raise ApiError(503, "request_aborted", "the request was aborted by the server")
    return events


class ClientDisconnected(ApiError):
    def __init__(self) -> None:
        super().__init__(499, "client_disconnected", "the client closed the connection before the answer")


async def wait_disconnect(request: Request) -> None:
    """Return when the client has gone (the body is read: the next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: Request, generation: Generation) -> list[StreamEvent]:
    """All of the generation's events, or `ClientDisconnected` as soon as the client goes away."""

    async def run() -> list[StreamEvent]:
        return [event async for event in generation.events()]

    work, watcher = asyncio.ensure_future(run()), asyncio.ensure_future(wait_disconnect(request))
    try:
        await asyncio.wait((work, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this handler itself is cancelled
        for task in (watcher, work):
            if not task.done():
                task.cancel()
        await asyncio.gather(watcher, work, return_exceptions=True)
    if work.cancelled():  # the watcher saw the disconnect first
        logger.info("client disconnected from non-streamed request %s", generation.request_id)
        raise ClientDisconnected() from asyncio.CancelledError()
    return work.result()


def _reuse_path(cached_tokens: int, host_cached_tokens: int) -> str:
    """The request log's `prefix_reuse_path`: host_restore | checkpoint | none."""
    if host_cached_tokens:
        return "host_restore"
    return "checkpoint" if cached_tokens else "none"
