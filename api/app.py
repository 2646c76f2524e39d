"""The FastAPI app: factory, lifespan (engine start / drain), the request gate and error rendering.

The gate (a plain ASGI middleware) runs before any route: it stamps a request id header (`x-request-id`
on OpenAI routes, `request-id` on Anthropic ones), answers 503 while draining, checks the API key
(constant-time; `/health`, `/ready`, `/stats`, `/metrics` and OPTIONS are exempt), enforces
`--max-request-mib` on declared and streamed bodies and refuses a body that stalls `--body-timeout-s`
(408). Every error leaves in the calling protocol's shape (api.errors). A generation request it lets through is
announced to the engine at once (`AsyncEngine.announce`: an idle engine may hold its first step while the body
arrives and the route templates and tokenizes it, so a burst shares one prefill), and the announcement is
withdrawn when the exchange ends (a no-op once the request reached the engine; what ends the hold for one that
failed first).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api import health
from api.anthropic.routes import router as anthropic_router
from api.engine_client import EngineClient
from api.errors import ApiError, error_response, is_anthropic_path
from api.openai.routes import router as openai_router
from api.openai.store import ResponseStore
from api.options import ServerOptions
from api.request_log import RequestLog
from api.state import ServerState, new_id
from api.tracing import RequestTracing, request_headers
from engine.config import EngineConfig
from monitor.metrics import ServerMetrics

logger = logging.getLogger("ninfer.api")

EXEMPT_PATHS = ("/health", "/ready", "/stats", "/metrics")
GENERATION_PATHS = ("/v1/chat/completions", "/v1/responses", "/v1/messages")


def _error_code(body: bytes) -> str | None:
    """The machine code of an error body in either protocol's shape."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    return error.get("code") or error.get("type") if isinstance(error, dict) else None


class _BodyTooLarge(ApiError):
    def __init__(self, limit: int) -> None:
        super().__init__(
            413, "request_too_large", f"the request body exceeds {limit} bytes (--max-request-mib)"
        )


class _BodyTimeout(ApiError):
    def __init__(self, seconds: float) -> None:
        super().__init__(
            408, "request_timeout", f"the request body stalled for {seconds:g} s (--body-timeout-s)"
        )


class RequestGate:
    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        request_id = new_id("req_")
        scope.setdefault("state", {})["request_id"] = request_id
        header = b"request-id" if is_anthropic_path(path) else b"x-request-id"

        sent: list[Any] = []  # the status, then up to 64 KiB of an error body (for the request log)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (header, request_id.encode())]
                sent.append(message["status"])
            elif message["type"] == "http.response.body" and sent and sent[0] >= 400:
                sent.append(message.get("body", b"")[:65536])
            await send(message)

        if self.state.tracing is not None:  # the request span continues an incoming traceparent
            request_headers.set(scope["headers"])
        try:
            error = self._refusal(scope, path)
            if error is not None:
                close = {"Connection": "close"} if isinstance(error, _BodyTooLarge) else None
                response = error_response(error, path, close)
                await response(scope, receive, send_with_id)
                return
            self._announce(scope, path, request_id)
            await self.app(scope, self._limited(receive), send_with_id)
        finally:
            self._withdraw(request_id)
            self._log_ending(scope, request_id, sent)

    def _announce(self, scope: Scope, path: str, request_id: str) -> None:
        """Tell the engine a generation request is coming (burst admission; an engine without it, such as a
        test's scripted engine, is not told)."""
        announce = getattr(self.state.engine, "announce", None)
        if announce is not None and scope["method"] == "POST" and path in GENERATION_PATHS:
            announce(request_id)

    def _withdraw(self, request_id: str) -> None:
        withdraw = getattr(self.state.engine, "withdraw", None)
        if withdraw is not None:
            withdraw(request_id)

    def _log_ending(self, scope: Scope, request_id: str, sent: list[Any]) -> None:
        """Every generation request gets exactly one ending in the request log: the ones refused before a
        route logged `request_start` (bad JSON, body too large, draining, ...), cut before any response,
        or answered without reaching the engine get one here (phase "http")."""
        ended = self.state.log_ended.pop(request_id, None)
        if ended or scope["method"] != "POST" or scope["path"] not in GENERATION_PATHS:
            return
        status = sent[0] if sent else None
        fields: dict[str, Any] = dict(request_id=request_id, path=scope["path"], phase="http", status=status)
        if status is None:
            self.state.log("request_rejected", **fields, code="client_disconnected")
        elif status >= 400:
            body = b"".join(sent[1:])
            self.state.log("request_rejected", **fields, code=_error_code(body))
        else:  # answered without an engine request: nothing was generated
            result = {"finish_reason": "length", "prompt_tokens": 0, "completion_tokens": 0}
            self.state.log("request_done", **fields, result=result, timings_seconds={})

    def _refusal(self, scope: Scope, path: str) -> ApiError | None:
        exempt = path in EXEMPT_PATHS or scope["method"] == "OPTIONS"
        app_state = scope["app"].state if "app" in scope else None
        if not exempt and getattr(app_state, "draining", False):
            return ApiError(503, "server_shutting_down", "the server is shutting down")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        key = self.state.options.api_key
        if key is not None and not exempt and not _key_matches(headers, key):
            return ApiError(401, "invalid_api_key", "missing or invalid API key")
        limit = self.state.options.max_request_bytes
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            return _BodyTooLarge(limit)
        return None

    def _limited(self, receive: Receive) -> Receive:
        """`receive` with the body size limit and, until the body is complete, the body read timeout."""
        limit = self.state.options.max_request_bytes
        timeout = self.state.options.body_timeout_seconds
        seen, complete = 0, False

        async def wrapped() -> Message:
            nonlocal seen, complete
            if complete:  # waiting for the disconnect: no timeout
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), timeout)
            except TimeoutError:
                raise _BodyTimeout(timeout) from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _BodyTooLarge(limit)
                complete = not message.get("more_body", False)
            return message

        return wrapped


def _key_matches(headers: dict[str, str], key: str) -> bool:
    given = headers.get("x-api-key")
    auth = headers.get("authorization", "")
    if given is None and auth[:7].lower() == "bearer ":
        given = auth[7:].strip()
    return given is not None and hmac.compare_digest(given.encode(), key.encode())


async def _api_error(request: Request, exc: Exception) -> Any:
    assert isinstance(exc, ApiError)
    # a body cut short (timeout, too large) leaves unread bytes on the connection: close it after this
    headers = {"Connection": "close"} if isinstance(exc, _BodyTimeout | _BodyTooLarge) else None
    return error_response(exc, request.url.path, headers)


async def _http_error(request: Request, exc: Exception) -> Any:
    assert isinstance(exc, StarletteHTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return error_response(ApiError(exc.status_code, code, str(exc.detail)), request.url.path)


async def _validation_error(request: Request, exc: Exception) -> Any:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    param = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
    error = ApiError(400, "invalid_request", str(first.get("msg", "invalid request")), param=param)
    return error_response(error, request.url.path)


async def _unexpected(request: Request, exc: Exception) -> Any:
    if isinstance(exc, RecursionError):  # a body nested deeper than the converters or the template recurse
        error = ApiError(400, "invalid_request", "the request is nested too deeply")
        return error_response(error, request.url.path)
    logger.exception("unhandled error on %s", request.url.path)
    return error_response(
        ApiError(500, "internal_error", f"internal error: {type(exc).__name__}"), request.url.path
    )


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    state: ServerState = app.state.server
    options = state.options
    if options.request_log_jsonl is not None:
        max_bytes = int(options.request_log_max_mib * 1024 * 1024)
        state.request_log = RequestLog(
            options.request_log_jsonl, max_bytes=max_bytes, keep=options.request_log_keep
        )
    started = time.monotonic()
    state.engine.start()
    state.load_seconds = time.monotonic() - started
    state.metrics.set_model(
        model_id=state.engine.model_id,
        served_model_id=state.served_model_id,
        weights_id=getattr(state.engine, "weights_id", None) or "",
        artifact_sha256=options.artifact_sha256,
        kv_dtype=state.engine.config.cache.kv_dtype,
        max_context=state.engine.config.scheduler.max_context,
    )
    state.log(
        "server_start",
        artifact=state.artifact,
        synthetic=state.synthetic,  # geometry name when the weights are random (`--synthetic`), else null
        model_id=state.engine.model_id,
        served_model_id=state.served_model_id,
        engine_config=_loggable_engine_config(state.engine.config),
        options=_loggable_options(options),
        argv=app.state.argv,
        request_log_repaired_bytes=state.request_log.repaired_bytes if state.request_log else 0,
    )
    ticker = asyncio.create_task(_throughput_loop(state)) if options.log_stats_interval_ms else None
    state.ready = True
    try:
        yield
    finally:
        app.state.draining = True
        state.ready = False
        if ticker is not None:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
        await asyncio.to_thread(state.engine.shutdown, True)
        if state.tracing is not None:
            await asyncio.to_thread(state.tracing.shutdown)  # exports what is still batched
        if state.request_log is not None:
            state.request_log.close()


def _loggable_engine_config(config: EngineConfig) -> dict[str, Any]:
    """The engine config as logged: defaults that resolve from other fields show their effective value."""
    values = dataclasses.asdict(config)
    values["scheduler"]["prefill_chunk_decoding"] = config.scheduler.effective_prefill_chunk_decoding
    return values


def _loggable_options(options: ServerOptions) -> dict[str, Any]:
    values = dataclasses.asdict(options)
    values["api_key"] = None if options.api_key is None else "<redacted>"
    return values


async def _throughput_loop(state: ServerState) -> None:
    """Every interval: what the engine computed (prefill and decode tokens per second: its progress, also in
    the middle of a long prompt) and what the HTTP side finished (requests, their prompt/completion tokens)."""
    interval = state.options.log_stats_interval_ms / 1000.0

    def sample() -> tuple[float, int, int, int, int, int, Any]:
        stats = state.engine.stats()
        return (time.monotonic(), state.prompt_tokens_total, state.completion_tokens_total, state.num_requests,
                getattr(stats, "num_prefill_tokens", 0), getattr(stats, "num_decode_tokens", 0), stats)  # fmt: skip

    last = sample()
    while True:
        await asyncio.sleep(interval)
        now = sample()
        seconds = max(now[0] - last[0], 1e-9)
        prompt, completion = now[1] - last[1], now[2] - last[2]
        prefill, decode = now[4] - last[4], now[5] - last[5]
        stats = now[6]
        state.log(
            "throughput",
            interval_seconds=seconds,
            requests=now[3] - last[3],
            prompt_tokens=prompt,
            completion_tokens=completion,
            completion_tokens_per_second=completion / seconds,
            prefill_tokens_per_second=prefill / seconds,
            decode_tokens_per_second=decode / seconds,
            in_flight=state.in_flight,
            engine=health.stats_dict(stats),
        )
        logger.info(
            "throughput interval=%.1fs prefill=%.1f tok/s decode=%.1f tok/s running=%d waiting=%d in_flight=%d",
            seconds,
            prefill / seconds,
            decode / seconds,
            getattr(stats, "num_running", 0),
            getattr(stats, "num_waiting", 0),
            state.in_flight,
        )
        last = now


def create_app(
    engine: EngineClient,
    options: ServerOptions | None = None,
    *,
    argv: Sequence[str] = (),
    artifact: str | None = None,
    tracing: RequestTracing | None = None,
) -> FastAPI:
    """`tracing`: request spans go there; None = as the OTEL_* variables say (off when they say nothing)."""
    options = options or ServerOptions()
    state = ServerState(
        engine=engine,
        options=options,
        artifact=artifact,
        metrics=ServerMetrics(vllm_aliases=options.metrics_vllm_aliases),
        tracing=tracing if tracing is not None else RequestTracing.from_env(),
    )
    state.store = ResponseStore(
        options.response_store_max_records, options.response_store_max_mib * 1024 * 1024
    )
    # The OpenAPI document (request bodies declared per route via api.body.json_body_doc) is served so
    # clients and fuzzers (schemathesis, tests/resilience) can read the real request shapes.
    app = FastAPI(
        title="NInfer", lifespan=_lifespan, docs_url=None, redoc_url=None, openapi_url="/openapi.json"
    )
    app.state.server = state
    app.state.draining = False
    app.state.argv = list(argv)
    app.include_router(health.router)
    app.include_router(openai_router)
    app.include_router(anthropic_router)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _unexpected)
    app.add_middleware(RequestGate, state=state)
    if options.cors:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=["*"],
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["*"],
        )
    return app
