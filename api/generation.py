"""One engine request seen from the HTTP layer: parsed text events out, usage and the ending at the end.

`Generation.start()` submits the prompt and waits for the engine's first event, so a request the engine
refuses (overloaded, queue timeout, context) becomes an HTTP error before any stream byte is sent.
`Generation.events()` then yields `ReasoningDelta` / `ContentDelta` / `ToolCallEvent` from the streaming
parser. Stop strings are matched on the detokenized answer only (never on the reasoning: matching starts
after `</think>`; never inside a tool call's markup, so a call arrives whole); a match ends the request in
the engine at once. A call that max_tokens or the context cuts arrives as a cut call (`ToolCall.partial_json`,
engine/chat/parse.py) or not at all, never as markup in the text. Leaving the iteration early (client
disconnect, cancellation) aborts the engine request, so no lane stays held (DESIGN invariant 5).

Thinking budget (Anthropic `thinking.budget_tokens`, effort tiers, `--thinking-budget`): a field of the
engine request (`SamplingParams.thinking_budget`); the engine's scheduler closes the reasoning with the
template's `\n</think>\n\n` once the budget is spent, and those tokens stream up like generated ones.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from api.engine_client import EngineClient
from api.errors import ApiError
from api.prompt import Prompt
from engine.chat.parse import StreamEvent, StreamingParser
from engine.media.image import MediaError
from engine.request import (
    FinishEvent,
    FinishKind,
    RejectCode,
    SamplingParams,
    SpecRequestStats,
    TokenEvent,
    TokenLogprob,
)
from engine.tokenizer import IncrementalDetokenizer, StopMatcher, Tokenizer

logger = logging.getLogger("ninfer.api")

_END = object()  # read_ahead(): the events are all read

_REJECT_STATUS = {
    RejectCode.OVERLOADED: 429,
    RejectCode.QUEUE_TIMEOUT: 503,
    RejectCode.CONTEXT_LENGTH: 400,
    RejectCode.TOO_LARGE: 400,
}


def _token_entry(tokenizer: Tokenizer, token_id: int, logprob: float) -> dict[str, Any]:
    text = tokenizer.decode([token_id])
    return {"token": text, "logprob": max(logprob, -9999.0), "bytes": list(text.encode("utf-8"))}


def logprob_entry(tokenizer: Tokenizer, lp: TokenLogprob) -> dict[str, Any]:
    """OpenAI's shape (Chat `logprobs.content[]`, Responses `output_text.logprobs[]`)."""
    entry = _token_entry(tokenizer, lp.token_id, lp.logprob)
    entry["top_logprobs"] = [_token_entry(tokenizer, t, v) for t, v in lp.top]
    return entry


def rejection_error(event: FinishEvent) -> ApiError:
    reason = event.reason
    if reason.kind is FinishKind.REJECTED and reason.code is not None:
        param = "messages" if reason.code in (RejectCode.CONTEXT_LENGTH, RejectCode.TOO_LARGE) else None
        message = reason.message or reason.code.value.replace("_", " ")
        return ApiError(_REJECT_STATUS.get(reason.code, 503), reason.code.value, message, param=param)
    return ApiError(503, "request_aborted", reason.message or "the request was aborted by the server")


@dataclass(slots=True)
class Outcome:
    """How a generation ended and what it cost; filled when `events()` is exhausted."""

    finish: str = "stop"  # stop | length | context | aborted
    stop_sequence: str | None = None  # the stop string that ended it, if any
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    host_cached_tokens: int = 0  # of cached_tokens, restored from host RAM (host KV parking)
    speculative: SpecRequestStats | None = None  # `--spec`: the request's rounds, drafts, acceptance
    reasoning_tokens: int = 0
    tool_parse_fallbacks: tuple[str, ...] = ()
    logprobs: list[dict[str, Any]] | None = None  # the answer's tokens (`logprob_entry`), when asked for
    queue_start: float = 0.0
    first_token_at: float | None = None
    end_at: float | None = None
    queue: float | None = None  # engine-measured: waiting for a lane
    prefill: float | None = None  # engine-measured: admission to the first sampled token

    def timings(self) -> dict[str, float | None]:
        end = self.end_at or time.monotonic()
        ttft = None if self.first_token_at is None else self.first_token_at - self.queue_start
        decode = None if self.first_token_at is None else end - self.first_token_at
        timings = {"ttft": ttft, "decode": decode, "total": end - self.queue_start}
        if self.queue is not None:
            timings["queue"] = self.queue
        if self.prefill is not None:
            timings["prefill"] = self.prefill
        return timings


class Generation:
    def __init__(
        self,
        engine: EngineClient,
        request_id: str,
        prompt: Prompt,
        params: SamplingParams,
        *,
        tools: Sequence[Mapping[str, Any]] | None,
        calls_in_reasoning: bool = False,
        thinking_budget: int | None = None,
    ) -> None:
        self.engine = engine
        self.request_id = request_id
        self.prompt = prompt
        # Stop strings are the API's job (matched on the answer's text); the engine gets none.
        self.params = replace(params, stop=())
        if thinking_budget is not None:
            self.params = replace(self.params, thinking_budget=thinking_budget)
        tokenizer = engine.tokenizer
        # Stop strings are matched on the answer's text: not in the reasoning (they are armed by `</think>`, a
        # whole token) and not inside a tool call's markup (`_feed`).
        self._stops = StopMatcher(params.stop) if params.stop else None
        self._stops_armed = not prompt.in_reasoning
        self._stop_matched: str | None = None
        self._detok = IncrementalDetokenizer(tokenizer)
        self._parser = StreamingParser(
            tools or None,
            in_reasoning=prompt.in_reasoning,
            calls_in_reasoning=calls_in_reasoning,
            tolerant=calls_in_reasoning,  # `--tolerant-tool-calls` turns on every recovery
        )
        self._think_end_id = tokenizer.special_ids.think_end_id
        self._in_reasoning = prompt.in_reasoning
        self._stream: AsyncIterator[Any] | None = None
        self._ahead: tuple[asyncio.Queue[Any], asyncio.Future[None]] | None = None  # read_ahead()
        self._first: Any = None
        self._done = False
        self.outcome = Outcome(prompt_tokens=len(prompt.token_ids))
        if params.logprobs is not None:
            self.outcome.logprobs = []

    async def start(self) -> None:
        """Submit and wait for the first event; raise `ApiError` if the engine refused the request."""
        self.outcome.queue_start = time.monotonic()
        self._stream = self._submit(self.request_id, self.prompt.token_ids, self.params)
        try:
            first = await anext(self._stream)
        except MediaError as exc:  # the engine's own media checks (the API checks first)
            self._done = True
            raise ApiError(400, exc.code, str(exc), param="messages") from None
        except ValueError as exc:  # malformed input the engine refused (ids outside the vocabulary...)
            self._done = True
            raise ApiError(400, "invalid_prompt", str(exc), param="messages") from None
        except StopAsyncIteration:
            self._done = True
            raise ApiError(503, "engine_error", "the engine ended the request without a result") from None
        if isinstance(first, FinishEvent) and first.reason.kind in (FinishKind.REJECTED, FinishKind.ABORTED):
            self._done = True
            raise rejection_error(first)
        self._first = first

    def _submit(self, request_id: str, token_ids: list[int], params: SamplingParams) -> AsyncIterator[Any]:
        media = {"media": self.prompt.media} if self.prompt.media is not None else {}
        return aiter(
            self.engine.generate(
                request_id,
                token_ids,
                params,
                checkpoint_positions=self.prompt.checkpoint_positions,
                thinking=self.prompt.thinking,
                **media,
            )
        )

    def read_ahead(self) -> None:
        """Consume the engine's events from now on (parsing, stop strings, logprobs) into a buffer that
        `events()` replays: a choice whose answer cannot be sent yet (n > 1: later choices wait for a lane)
        still ends in the engine at its stop string, instead of running to max_tokens unread."""
        assert self._ahead is None, "read_ahead() once"
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def pump() -> None:
            try:
                async for event in self._read():
                    queue.put_nowait(event)
            except Exception as exc:  # re-raised by events(), as reading directly would
                queue.put_nowait(exc)
            finally:  # (also when cancelled: a reader waiting on the queue is never left hanging)
                queue.put_nowait(_END)

        self._ahead = (queue, asyncio.ensure_future(pump()))

    async def events(self) -> AsyncIterator[StreamEvent]:
        if self._ahead is None:
            async for event in self._read():
                yield event
            return
        queue, task = self._ahead
        try:
            while (item := await queue.get()) is not _END:
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            if not task.done():  # left early: stop reading (the reader's exit aborts the engine request)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _read(self) -> AsyncIterator[StreamEvent]:
        assert self._stream is not None, "call start() first"
        try:
            event = self._first
            while True:
                if isinstance(event, TokenEvent):
                    for out in self._on_tokens(event.token_ids, event.logprobs):
                        yield out
                elif isinstance(event, FinishEvent):
                    for out in self._on_finish(event):
                        yield out
                    return
                try:
                    event = await anext(self._stream)
                except StopAsyncIteration:
                    raise ApiError(503, "engine_error", "the engine stream ended without a finish") from None
        finally:
            if not self._done:
                self.abort()
            aclose = getattr(self._stream, "aclose", None)
            if aclose is not None:
                await aclose()

    def abort(self) -> None:
        if not self._done:
            self._done = True
            self.engine.abort(self.request_id)

    def _on_tokens(
        self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob] | None = None
    ) -> list[StreamEvent]:
        outcome = self.outcome
        if outcome.first_token_at is None:
            outcome.first_token_at = time.monotonic()
        if self._stop_matched is not None:
            return []  # already stopped; the engine's finish is on its way
        events: list[StreamEvent] = []
        for k, tid in enumerate(token_ids):
            outcome.completion_tokens += 1
            if self._in_reasoning or (outcome.completion_tokens == 1 and tid == self._think_start_id()):
                self._in_reasoning = tid != self._think_end_id
                outcome.reasoning_tokens += 1
            elif logprobs is not None and outcome.logprobs is not None and k < len(logprobs):
                outcome.logprobs.append(
                    logprob_entry(self.engine.tokenizer, logprobs[k])
                )  # answer tokens only
            events += self._feed(self._detok.add(tid))
            if self._stop_matched is not None:
                outcome.stop_sequence = self._stop_matched
                self.engine.abort(self.request_id)
                return events + self._parser.finish()
            self._stops_armed = self._stops_armed or not self._in_reasoning  # the reasoning ended here
        return events

    def _feed(self, text: str, *, final: bool = False) -> list[StreamEvent]:
        """Parse `text`, matching the stop strings where they are armed. A match is passed over while the
        parser is inside a tool call's markup (or on what may still open one): the call arrives whole."""
        if self._stops is None or not self._stops_armed:
            return self._parser.feed(text)
        events: list[StreamEvent] = []
        while True:
            before, matched = self._stops.push(text, final=final)
            events += self._parser.feed(before)
            if matched is None:
                return events
            if not self._parser.in_tool_call():
                self._stop_matched = matched
                return events
            text = self._stops.skip(matched)
            events += self._parser.feed(matched)

    def _think_start_id(self) -> int | None:
        return self.engine.tokenizer.special_ids.think_start_id

    def _on_finish(self, event: FinishEvent) -> list[StreamEvent]:
        self._done = True
        outcome = self.outcome
        outcome.end_at = time.monotonic()
        outcome.prompt_tokens = event.num_prompt_tokens or outcome.prompt_tokens
        outcome.completion_tokens = max(outcome.completion_tokens, event.num_output_tokens)
        outcome.cached_tokens = event.num_cached_tokens
        outcome.host_cached_tokens = event.num_host_cached_tokens
        outcome.speculative = event.speculative
        outcome.queue, outcome.prefill = event.queue_seconds, event.prefill_seconds
        events: list[StreamEvent] = []
        if self._stop_matched is None:
            kind = event.reason.kind
            events += self._feed(self._detok.finish(), final=True)
            # A call the output limit cut is a cut call (or nothing), never its markup as text.
            events += self._parser.finish(truncated=kind in (FinishKind.LENGTH, FinishKind.CONTEXT))
            outcome.finish = kind.value if kind is not FinishKind.REJECTED else "aborted"
        if self._stop_matched is not None:  # (also one found only in the text held back to the end)
            outcome.stop_sequence = self._stop_matched
            outcome.finish = "stop"
        outcome.tool_parse_fallbacks = tuple(self._parser.fallbacks)
        return events
