"""AsyncEngine: one background loop thread owns the model; each request streams through an asyncio queue.

Owns: the loop thread, the command list (add / abort) it drains at step boundaries, and the
per-request streams. Must not touch: HTTP, protocol shapes (api/), metrics objects (monitor/): it hands
up plain events and an `EngineStats` snapshot.

Threads:

    asyncio loop(s)                              engine loop thread
    ---------------                              ------------------
    generate(): register stream, push "add" ---> drain commands -> EngineCore.step() -> events
    abort() / consumer stops: push "abort"  ---> ...
    stream queue.get() <-- call_soon_threadsafe(queue.put_nowait, event) --+

The loop never spins: with no work it sleeps on a condition until a command arrives; when requests
wait but nothing can run, it sleeps until a command or the oldest request's pending deadline.

Burst admission (`EngineConfig.burst_wait_ms`, `--burst-wait-ms`): the API `announce()`s a request as soon as
it arrives, before its body is read and the chat template and the tokenizer run (milliseconds for a long prompt), and
`generate()` consumes the announcement; a request refused or failed before that `withdraw()`s it. An idle
engine (no lane busy, no step in flight) whose waiting requests leave lanes and prefill budget free, and that
knows of announced requests still in preparation, holds its first step: until every announced request has been
added or withdrawn and no new one has arrived for a quarter of `burst_wait_ms` (`BURST_QUIET_FRACTION`), and
never longer than `burst_wait_ms` from the moment it could have stepped. Simultaneous arrivals are then
admitted together and share one batched prefill step (the scheduler admits every waiting request that fits;
the step's prefill budget is `prefill_chunk`). A lone request (nothing else announced) never waits, and a busy
engine never holds: its decoding lanes' next token must not wait for an arrival.
A stream hands over every event that is ready: when its consumer falls behind (a slow client, a busy
event loop), the `TokenEvent`s waiting in its queue are merged into one (`take_ready`), so the API frames
one SSE chunk for all of them instead of one chunk per step.
Every stream ends with exactly one `FinishEvent`; a consumer that stops iterating (client disconnect,
task cancelled) aborts its request, which frees its lane and pages at the next step boundary.
If the model raises, every request is ended with an aborted `FinishEvent` naming the error and the
engine refuses new requests (`error` is set).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Literal

import torch

from engine.config import EngineConfig
from engine.core import EngineCore, EngineStats, load_artifact
from engine.media.prompt import PromptMedia
from engine.model.config import ModelConfig
from engine.model.qwen3_5 import Qwen3_5ForCausalLM
from engine.model.vision_load import VisionParts
from engine.request import Event, FinishEvent, FinishReason, RejectCode, SamplingParams, TokenEvent
from engine.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

# A burst hold whose announced requests have all been added still waits this fraction of `burst_wait_ms` after the
# latest arrival (5 ms at the default 20): a client's "simultaneous" requests reach the server spread over a few
# milliseconds, and the first may be prepared before the last has arrived.
BURST_QUIET_FRACTION = 0.25

_Add = tuple[Literal["add"], str, list[int], SamplingParams, tuple[int, ...], bool, PromptMedia | None]
_Abort = tuple[Literal["abort"], str, str]


class AsyncEngine:
    """Use: `from_artifact(...)`, `start()`, `async for event in generate(...)`, `shutdown()`."""

    def __init__(
        self,
        model: Qwen3_5ForCausalLM,
        tokenizer: Tokenizer,
        config: EngineConfig,
        *,
        model_id: str,
        seed: int | None = None,
        server_sampling: SamplingParams | None = None,
        synthetic: str | None = None,
        weights_id: str | None = None,
        vision: VisionParts | None = None,
    ) -> None:
        """`synthetic`: the geometry name when the weights are random (engine/testing/synthetic.py: servers
        must say so); `weights_id`: what the metrics' model-info labels name ("" when None); `vision`: the
        vision tower, token ids and preprocessor config (`--vision`; the API prepares media with them)."""
        self.vision = vision
        self.config = config
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.model_config: ModelConfig = model.config
        self._core = EngineCore(
            model, tokenizer, config, seed=seed, server_sampling=server_sampling, vision=vision
        )
        self.grammars = self._core.grammars  # structured outputs: `grammars.check(spec)` before `generate`
        self._cv = threading.Condition()
        self._commands: list[_Add | _Abort] = []
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[Event | ValueError]]] = {}
        self._announced: set[str] = set()  # request ids the API is preparing (burst admission)
        self._hold_until: float | None = None  # the current burst hold's end (monotonic), None: not holding
        self._last_arrival = 0.0  # monotonic time of the latest announcement or added request
        self._thread: threading.Thread | None = None
        self._accepting = True  # False once shutdown() begins
        self._drain = True
        self._stopping = False
        self._stats = self._core.stats()
        self.error: BaseException | None = None
        self._keep: object = None  # keeps the artifact (and its memory map) alive
        self.synthetic = synthetic
        self.weights_id = weights_id

    @classmethod
    def from_artifact(
        cls,
        path: str | Path,
        config: EngineConfig,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        seed: int | None = None,
        server_sampling: SamplingParams | None = None,
    ) -> AsyncEngine:
        """Load `path`. Not started: call `start()`."""
        loaded = load_artifact(
            path,
            device=device,
            dtype=dtype,
            with_mtp=config.spec == "mtp",
            lm_head_draft=config.lm_head_draft,
            with_dflash=config.spec == "dflash",
            with_vision=config.vision,
        )
        engine = cls(
            loaded.model,
            loaded.tokenizer,
            config,
            model_id=loaded.model_id,
            seed=seed,
            server_sampling=server_sampling,
            vision=loaded.vision,
        )
        engine._keep = loaded.artifact
        return engine

    # ---- lifecycle ------------------------------------------------------------------------------

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("AsyncEngine.start(): already started")
        self._thread = threading.Thread(target=self._loop, name="ninfer-engine", daemon=True)
        self._thread.start()

    def shutdown(self, drain: bool = True, timeout: float | None = None) -> None:
        """Refuse new requests; with `drain` let running and waiting ones finish, else abort them.
        Blocks until the loop thread has ended (or `timeout` seconds passed)."""
        with self._cv:
            self._accepting = False
            self._announced.clear()
            self._drain = drain
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    # ---- requests -------------------------------------------------------------------------------

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        checkpoint_positions: Sequence[int] = (),
        *,
        thinking: bool = True,
        media: PromptMedia | None = None,
    ) -> AsyncIterator[Event]:
        """Stream `TokenEvent`s then exactly one `FinishEvent` (also for a refusal).

        `thinking` picks the sampling preset (the chat template's thinking mode); `media`: the prompt's images
        and video (engine/media/prompt.py). Malformed input (empty prompt, ids outside the vocabulary, a
        request_id already streaming) raises ValueError; media the engine cannot take raise `MediaError`.
        """
        if not prompt_token_ids:
            raise ValueError("prompt_token_ids: must hold at least one token")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event | ValueError] = asyncio.Queue()
        with self._cv:
            self._announced.discard(request_id)  # arrived (or refused below): nothing to wait for
            refusal = self._refusal(request_id, len(prompt_token_ids))
            if refusal is None:
                if request_id in self._streams:
                    raise ValueError(f"request_id={request_id!r}: already streaming")
                self._streams[request_id] = (loop, queue)
                add: _Add = (
                    "add",
                    request_id,
                    list(prompt_token_ids),
                    params,
                    tuple(checkpoint_positions),
                    thinking,
                    media,
                )
                self._commands.append(add)
                self._last_arrival = time.monotonic()
                self._cv.notify_all()
        if refusal is not None:
            yield refusal
            return
        finished = False
        try:
            while True:
                for event in take_ready(await queue.get(), queue):
                    if isinstance(event, ValueError):  # refused by EngineCore.add_request: never queued
                        finished = True
                        raise event
                    finished = isinstance(event, FinishEvent)
                    yield event
                    if finished:
                        return
        finally:
            with self._cv:
                self._streams.pop(request_id, None)
            if not finished:
                self.abort(request_id, "the client stopped reading")

    def _refusal(self, request_id: str, num_prompt_tokens: int) -> FinishEvent | None:
        if self.error is not None:
            message = f"engine failed: {type(self.error).__name__}: {self.error}"
        elif not self._accepting:
            message = "the engine is shutting down"
        else:
            return None
        reason = FinishReason.rejected(RejectCode.OVERLOADED, message)
        return FinishEvent(request_id, reason, num_prompt_tokens, 0, 0)

    def announce(self, request_id: str) -> None:
        """A request `request_id` has arrived and is being prepared (templated, tokenized): an idle engine may
        hold its first step for it (module docstring). `generate(request_id, ...)` consumes the announcement;
        if the request never gets there, `withdraw(request_id)`. Any thread; a no-op with the hold off."""
        if self.config.burst_wait_ms <= 0:
            return
        with self._cv:
            if self._accepting:
                self._announced.add(request_id)
                self._last_arrival = time.monotonic()

    def withdraw(self, request_id: str) -> None:
        """Cancel `announce(request_id)` (the request failed or was refused before `generate`); a no-op when it
        was consumed or never made. Any thread."""
        with self._cv:
            if request_id in self._announced:
                self._announced.discard(request_id)
                self._cv.notify_all()  # a hold waiting for it ends now

    def abort(self, request_id: str, message: str = "aborted") -> None:
        """End a request (its stream gets an aborted FinishEvent if still read). Any thread."""
        with self._cv:
            self._commands.append(("abort", request_id, message))
            self._cv.notify_all()

    def stats(self) -> EngineStats:
        """The snapshot taken after the loop's latest iteration (`num_announced`: now)."""
        with self._cv:
            announced = len(self._announced)
        return dataclasses.replace(self._stats, num_announced=announced) if announced else self._stats

    # ---- the loop thread ------------------------------------------------------------------------

    def _loop(self) -> None:
        core = self._core
        try:
            while True:
                core.num_loop_iterations += 1  # every pass, idle wake-ups included
                with self._cv:
                    commands, self._commands = self._commands, []
                    stopping, drain = self._stopping, self._drain
                events: list[Event] = [e for c in commands if (e := self._apply(c)) is not None]
                if stopping and not drain:
                    events += core.abort_all("the engine shut down")
                if events:  # refusals and aborts: answered before any step
                    self._snapshot()
                    self._publish(events)
                if not core.has_work():
                    self._hold_until = None  # a hold whose requests all went away (aborted) is over
                    self._snapshot()
                    if stopping:
                        return
                    self._wait(None)
                    continue
                if self._burst_hold():
                    continue  # woken by an arrival or a withdrawal: take the commands, then decide again
                self._hold_until = None
                events = core.step()
                self._snapshot()  # before publishing: a consumer that saw an event sees its stats
                self._publish(events)
                if not events and core.scheduler.num_running == 0:
                    self._wait(core.next_deadline())  # requests wait but none can run: sleep
        except Exception as exc:  # the model or a kernel failed: end every stream, refuse new ones
            logger.exception("engine loop failed")
            self._fail(exc)

    def _apply(self, command: _Add | _Abort) -> FinishEvent | None:
        if command[0] == "abort":
            return self._core.abort(command[1], command[2])
        _, request_id, prompt, params, checkpoints, thinking, media = command
        try:
            return self._core.add_request(
                request_id, prompt, params, checkpoints, thinking=thinking, media=media
            )
        except ValueError as exc:  # malformed input: handed to the stream, which raises it
            self._deliver(request_id, exc)
            return None

    def _burst_hold(self) -> bool:
        """Hold the first step of an idle engine while a burst arrives (module docstring); True when this pass
        waited (or has commands to take first), False to step now."""
        wait_s = self.config.burst_wait_ms / 1000.0
        if wait_s <= 0 or not self._core.can_batch_more():
            return False
        with self._cv:
            if self._stopping:
                return False
            if self._commands:
                return True
            now = time.monotonic()
            if self._hold_until is None:
                if not self._announced:
                    return False  # nothing is known to be coming: a lone request never waits
                self._hold_until = now + wait_s
                self._core.num_burst_holds += 1
            until = self._hold_until
            if not self._announced:  # all prepared: wait only while the burst is still arriving
                until = min(until, self._last_arrival + wait_s * BURST_QUIET_FRACTION)
            if now >= until:
                self._core.num_burst_timeouts += int(bool(self._announced))  # announced ones came too late
                return False
            self._cv.wait(until - now)
        return True

    def _wait(self, deadline: float | None) -> None:
        with self._cv:
            if self._commands or self._stopping and not self._core.has_work():
                return
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._cv.wait(timeout)

    def _publish(self, events: Sequence[Event]) -> None:
        for event in events:
            self._deliver(event.request_id, event)

    def _deliver(self, request_id: str, item: Event | ValueError) -> None:
        with self._cv:
            target = self._streams.get(request_id)
        if target is None:
            return  # the consumer has gone (an abort it caused, or a stop after disconnect)
        loop, queue = target
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # that event loop is closed: nobody is reading
            pass

    def _snapshot(self) -> None:
        self._stats = self._core.stats()

    def _fail(self, exc: Exception) -> None:
        message = f"engine failed: {type(exc).__name__}: {exc}"
        with self._cv:
            self.error = exc
            ids = list(self._streams)
            self._accepting = False
            self._announced.clear()
        reason = FinishReason.aborted(message)
        self._publish([FinishEvent(i, reason, 0, 0, 0) for i in ids])


def take_ready(
    first: Event | ValueError, queue: asyncio.Queue[Event | ValueError]
) -> list[Event | ValueError]:
    """`first` and every item already queued behind it, consecutive `TokenEvent`s merged into one."""
    out = [first]
    while not queue.empty():
        item = queue.get_nowait()
        last = out[-1]
        if isinstance(last, TokenEvent) and isinstance(item, TokenEvent):
            out[-1] = merge_tokens(last, item)
        else:
            out.append(item)
    return out


def merge_tokens(a: TokenEvent, b: TokenEvent) -> TokenEvent:
    """One event for `a`'s tokens then `b`'s (the same request)."""
    assert a.request_id == b.request_id, f"{a.request_id} != {b.request_id}"
    logprobs = None if a.logprobs is None and b.logprobs is None else (a.logprobs or ()) + (b.logprobs or ())
    return TokenEvent(a.request_id, a.token_ids + b.token_ids, b.num_output_tokens, logprobs)
