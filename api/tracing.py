"""OpenTelemetry traces: one SERVER span per generation request, named and attributed after the GenAI
semantic conventions, with child spans for the engine's phases. Off unless configured.

Configured means the standard variables ask for it: `OTEL_TRACES_EXPORTER` names an exporter other than
`none` (`otlp`, `otlp_proto_grpc`, `otlp_proto_http`, `console`, comma-separated), or
`OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (then `otlp`).
`OTEL_SDK_DISABLED=true` wins over both. `otlp` speaks gRPC unless `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` /
`OTEL_EXPORTER_OTLP_PROTOCOL` says `http/protobuf` (the Python SDK's default). Everything else (endpoint,
headers, timeouts, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`, `OTEL_BSP_*`)
is read by the SDK itself. Unconfigured, `from_env()` returns None, the SDK is never imported and every
request pays one `is None` test.

A request's span (`chat {model}`, kind SERVER) continues an incoming W3C `traceparent` and carries:

    gen_ai.operation.name, gen_ai.provider.name, gen_ai.request.{model, max_tokens, stream, temperature,
    top_p, top_k, seed, presence_penalty, frequency_penalty}, gen_ai.response.{model, finish_reasons,
    time_to_first_chunk}, gen_ai.usage.{input_tokens, output_tokens, cache_read.input_tokens,
    reasoning.output_tokens}, gen_ai.conversation.id (the `X-Session-Id` header), error.type,
    ninfer.{api, request.id, prefix_reuse.path, host_restore.tokens}

Children (kind INTERNAL, placed on the request's own timeline): `ninfer.queue` (waiting for a lane),
`ninfer.prefill` (admission to the first token; `ninfer.prefill.computed_tokens`, `.reused_tokens`) and
`ninfer.decode` (first token to the end). Events on the span: `ninfer.prefix_reuse` (path, tokens),
`ninfer.host_restore` (tokens, when the reused prefix came back from host RAM) and `gen_ai.first_token`.
Engine-specific numbers stay under `ninfer.*` (DEPLOY-NOTES 5), never invented `gen_ai.latency.*`.
"""

from __future__ import annotations

import contextvars
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

    from api.errors import ApiError
    from api.generation import Outcome
    from engine.request import SamplingParams

logger = logging.getLogger("ninfer.api")

PROVIDER = "ninfer"
SESSION_HEADER = "x-session-id"
OPERATION = "chat"  # all three protocols are chat-style generation
_TRUE = ("true", "1", "yes", "on")
_SAMPLING_ATTRIBUTES = (
    ("temperature", "gen_ai.request.temperature"),
    ("top_p", "gen_ai.request.top_p"),
    ("top_k", "gen_ai.request.top_k"),
    ("seed", "gen_ai.request.seed"),
    ("presence_penalty", "gen_ai.request.presence_penalty"),
    ("frequency_penalty", "gen_ai.request.frequency_penalty"),
)

# The incoming request's headers, set by the request gate (api.app) while tracing is on.
request_headers: contextvars.ContextVar[Sequence[tuple[bytes, bytes]]] = contextvars.ContextVar(
    "ninfer_request_headers", default=()
)


def exporter_names(environ: Mapping[str, str] | None = None) -> list[str]:
    """The exporter entry-point names the OTEL_* variables ask for ([] = tracing off)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() in _TRUE:
        return []
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    if not names:
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        names = ["otlp"] if endpoint else []
    if "none" in names:
        return []
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc"
    )
    otlp = "otlp_proto_http" if protocol.strip().lower().startswith("http") else "otlp_proto_grpc"
    return [otlp if n == "otlp" else n for n in names]


def _exporter(name: str) -> SpanExporter:
    from importlib.metadata import entry_points

    found = list(entry_points(group="opentelemetry_traces_exporter", name=name))
    if not found:
        raise ValueError(f"OTEL_TRACES_EXPORTER: no trace exporter named {name!r} is installed")
    exporter: SpanExporter = found[0].load()()
    return exporter


class RequestTracing:
    """Starts request spans on `provider`; `owned` providers are flushed and shut down with the server."""

    def __init__(self, provider: TracerProvider, *, owned: bool = False) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.owned = owned
        self.tracer: Tracer = provider.get_tracer("ninfer.api")
        self._propagator = TraceContextTextMapPropagator()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RequestTracing | None:
        """A tracer exporting where the OTEL_* variables say, or None when they configure nothing."""
        names = exporter_names(environ)
        if not names:
            return None
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        env = os.environ if environ is None else environ
        defaults = {} if env.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: "ninfer"}
        provider = TracerProvider(resource=Resource.create(defaults))
        for name in names:
            provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
        logger.info("OpenTelemetry traces on: exporters %s", ", ".join(names))
        return cls(provider, owned=True)

    def start(
        self, protocol: str, request_id: str, fields: Mapping[str, Any], served_model: str
    ) -> RequestSpan:
        from opentelemetry.trace import SpanKind

        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in request_headers.get()}
        parent = self._propagator.extract(headers) if "traceparent" in headers else None
        model = fields.get("model") or served_model
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": OPERATION,
            "gen_ai.provider.name": PROVIDER,
            "gen_ai.request.model": model,
            "ninfer.api": protocol,
            "ninfer.request.id": request_id,
        }
        if fields.get("max_tokens") is not None:
            attributes["gen_ai.request.max_tokens"] = int(fields["max_tokens"])
        if fields.get("stream") is not None:
            attributes["gen_ai.request.stream"] = bool(fields["stream"])
        if headers.get(SESSION_HEADER):
            attributes["gen_ai.conversation.id"] = headers[SESSION_HEADER][:256]
        span = self.tracer.start_span(
            f"{OPERATION} {model}", context=parent, kind=SpanKind.SERVER, attributes=attributes
        )
        return RequestSpan(self.tracer, span, served_model)

    def shutdown(self) -> None:
        if self.owned:
            self.provider.shutdown()  # flushes the batch processors


class RequestSpan:
    """One request's span; ended exactly once, by `rejected()` or `finish()`."""

    def __init__(self, tracer: Tracer, span: Span, served_model: str) -> None:
        self.tracer = tracer
        self.span = span
        self.served_model = served_model
        # Engine and API times are `time.monotonic()`; spans want epoch nanoseconds.
        self._epoch_ns = time.time_ns() - time.monotonic_ns()
        self._ended = False

    def _ns(self, monotonic_seconds: float) -> int:
        return self._epoch_ns + int(monotonic_seconds * 1e9)

    def sampling(self, params: SamplingParams) -> None:
        for field_name, attribute in _SAMPLING_ATTRIBUTES:
            value = getattr(params, field_name)
            if value is not None:
                self.span.set_attribute(attribute, value)

    def rejected(self, error: ApiError) -> None:
        """Refused before generating (validation, context length, overload, queue timeout)."""
        from opentelemetry.trace import StatusCode

        if self._ended:
            return
        self._ended = True
        self.span.set_attribute("error.type", error.code)
        self.span.set_attribute("http.response.status_code", error.status)
        self.span.set_attribute("gen_ai.response.finish_reasons", ["rejected"])
        self.span.set_status(StatusCode.ERROR, error.message[:500])
        self.span.end()

    def finish(self, record: Mapping[str, Any], outcome: Outcome, error: BaseException | None) -> None:
        """End the span from the request log's `request_done` record and the generation's timeline."""
        from opentelemetry.trace import StatusCode

        if self._ended:
            return
        self._ended = True
        span = self.span
        result: Mapping[str, Any] = record.get("result") or {}
        finish = str(result.get("finish_reason"))
        prompt = int(result.get("prompt_tokens") or 0)
        cached = int(result.get("prefix_cache_hit_tokens") or 0)
        host = int(result.get("host_cache_hit_tokens") or 0)
        ttft = (record.get("timings_seconds") or {}).get("ttft")
        path = str(result.get("prefix_reuse_path") or "none")
        span.set_attributes(
            {
                "gen_ai.response.model": self.served_model,
                "gen_ai.response.finish_reasons": [finish],
                "gen_ai.usage.input_tokens": prompt,
                "gen_ai.usage.output_tokens": int(result.get("completion_tokens") or 0),
                "gen_ai.usage.cache_read.input_tokens": cached,
                "gen_ai.usage.reasoning.output_tokens": int(result.get("reasoning_tokens") or 0),
                "ninfer.prefix_reuse.path": path,
            }
        )
        if ttft is not None:
            span.set_attribute("gen_ai.response.time_to_first_chunk", float(ttft))
        self._phases(outcome, prompt, cached, host, path)
        if finish == "client_disconnected":
            span.set_attribute("ninfer.client_disconnected", True)
        elif error is not None:
            span.set_attribute("error.type", type(error).__name__)
            span.record_exception(error)
            span.set_status(StatusCode.ERROR, str(error)[:500])
        elif finish == "aborted":
            span.set_attribute("error.type", "request_aborted")
            span.set_status(StatusCode.ERROR, "the request was aborted by the server")
        end = outcome.end_at
        span.end(end_time=self._ns(end) if end is not None else None)

    def _phases(self, outcome: Outcome, prompt: int, cached: int, host: int, path: str) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind

        start = outcome.queue_start
        if not start:
            return  # never submitted
        context: Context = trace.set_span_in_context(self.span)
        end = outcome.end_at if outcome.end_at is not None else time.monotonic()
        first = outcome.first_token_at
        admitted = start + outcome.queue if outcome.queue is not None else None
        if cached:
            attrs: dict[str, str | int] = {
                "ninfer.prefix_reuse.path": path,
                "ninfer.prefix_reuse.tokens": cached,
            }
            self.span.add_event("ninfer.prefix_reuse", attrs, self._ns(admitted or start))
        if host:
            self.span.set_attribute("ninfer.host_restore.tokens", host)
            self.span.add_event(
                "ninfer.host_restore", {"ninfer.host_restore.tokens": host}, self._ns(admitted or start)
            )
        if first is not None:
            self.span.add_event("gen_ai.first_token", {}, self._ns(first))

        def child(name: str, begin: float, until: float, attributes: dict[str, Any]) -> None:
            span = self.tracer.start_span(
                name,
                context=context,
                kind=SpanKind.INTERNAL,
                attributes=attributes,
                start_time=self._ns(begin),
            )
            span.end(end_time=self._ns(max(until, begin)))

        if admitted is not None:
            child("ninfer.queue", start, admitted, {"ninfer.queue.seconds": outcome.queue or 0.0})
        # Prefill ends where decode begins: at the first token as this server saw it (the engine's own prefill
        # seconds, which leave out the hand-off from the engine thread, are an attribute; without a first token,
        # e.g. a request that failed in prefill, they place the end).
        prefill_end = first
        if prefill_end is None and admitted is not None and outcome.prefill is not None:
            prefill_end = admitted + outcome.prefill
        if prefill_end is not None:
            prefill_attrs: dict[str, Any] = {
                "ninfer.prefill.computed_tokens": max(prompt - cached, 0),
                "ninfer.prefill.reused_tokens": cached,
                "ninfer.prefill.includes_queue": admitted is None,
            }
            if outcome.prefill is not None:
                prefill_attrs["ninfer.prefill.engine_seconds"] = outcome.prefill
            child("ninfer.prefill", admitted if admitted is not None else start, prefill_end, prefill_attrs)
        if first is not None:
            child("ninfer.decode", first, end, {"ninfer.decode.output_tokens": outcome.completion_tokens})
