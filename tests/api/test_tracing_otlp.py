"""OpenTelemetry end to end: `ninfer-serve` processes configured only by the standard OTEL_* variables export
their request spans to OTLP receivers this test runs on 127.0.0.1 — gRPC (a `TraceService` stub) for the
real server on the demo model, and OTLP/HTTP protobuf for the scripted engine, flushed at shutdown."""

from __future__ import annotations

import gzip
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from api_helpers import VENV_BIN, free_port, start_server, stop_server
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

HERE = Path(__file__).resolve().parent
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"


@dataclass
class Received:
    service: str
    span: Span

    @property
    def attributes(self) -> dict[str, Any]:
        return {kv.key: _value(kv.value) for kv in self.span.attributes}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


class Sink:
    """What the receivers got, flattened to spans; `wait()` blocks until a predicate holds."""

    def __init__(self) -> None:
        self.spans: list[Received] = []
        self._cv = threading.Condition()

    def add(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        with self._cv:
            for resource_spans in request.resource_spans:
                resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append(Received(str(resource.get("service.name")), span))
            self._cv.notify_all()

    def wait(self, ready: Callable[[list[Received]], bool], timeout: float = 20.0) -> list[Received]:
        with self._cv:
            if not self._cv.wait_for(lambda: ready(self.spans), timeout):
                raise AssertionError(f"receiver got {[r.span.name for r in self.spans]}")
            return list(self.spans)


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    def Export(self, request: Any, context: Any) -> trace_service_pb2.ExportTraceServiceResponse:  # noqa: N802
        self.sink.add(request)
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def grpc_receiver() -> Iterator[tuple[str, Sink]]:
    sink = Sink()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(sink), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"http://127.0.0.1:{port}", sink
    server.stop(grace=None)


@pytest.fixture
def http_receiver() -> Iterator[tuple[str, Sink]]:
    sink = Sink()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            sink.add(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
            reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", sink
    server.shutdown()
    server.server_close()


def _server_spans(spans: list[Received]) -> list[Received]:
    return [r for r in spans if r.span.kind == Span.SPAN_KIND_SERVER]


def test_grpc_receiver_gets_spans_from_ninfer_serve(
    grpc_receiver: tuple[str, Sink], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint, sink = grpc_receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "ninfer-e2e")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    port = free_port()
    cmd = [str(VENV_BIN / "ninfer-serve"), "--port", str(port), "--max-context", "384",
           "--default-max-tokens", "6", "--model-id", "tiny-e2e", "--log-stats-interval-ms", "0"]  # fmt: skip
    url, process = start_server(cmd, tmp_path / "server.log", port)
    try:
        headers = {"X-Session-Id": "agent-7", "traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
        body = {
            "model": "tiny-e2e",
            "messages": [{"role": "user", "content": "Name three colours of the sea."}],
            "max_tokens": 6,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60) as r:
            assert r.status_code == 200
            lines = [line for line in r.iter_lines() if line.startswith("data: {")]
        usage = httpx.Response(200, content=lines[-1][6:]).json()["usage"]
        long_body = {"messages": [{"role": "user", "content": "sea " * 600}], "max_tokens": 4}
        assert httpx.post(f"{url}/v1/chat/completions", json=long_body, timeout=60).status_code == 400

        spans = sink.wait(lambda got: len(_server_spans(got)) >= 2 and len(got) >= 5)
    finally:
        stop_server(process)
    ok, rejected = sorted(_server_spans(spans), key=lambda r: r.span.start_time_unix_nano)
    assert ok.service == "ninfer-e2e" and ok.span.name == "chat tiny-e2e"
    attrs = ok.attributes
    assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.provider.name"] == "ninfer"
    assert attrs["gen_ai.request.model"] == attrs["gen_ai.response.model"] == "tiny-e2e"
    assert attrs["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert attrs["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert attrs["gen_ai.usage.cache_read.input_tokens"] == usage["prompt_tokens_details"]["cached_tokens"]
    assert attrs["gen_ai.response.finish_reasons"] in (["stop"], ["length"])
    assert attrs["gen_ai.conversation.id"] == "agent-7"
    assert attrs["gen_ai.request.stream"] is True
    assert ok.span.trace_id.hex() == TRACE_ID and ok.span.parent_span_id.hex() == PARENT_ID
    children = {r.span.name for r in spans if r.span.parent_span_id == ok.span.span_id}
    assert children == {"ninfer.queue", "ninfer.prefill", "ninfer.decode"}
    assert rejected.attributes["error.type"] == "context_length_exceeded"
    assert rejected.span.status.code == rejected.span.status.STATUS_CODE_ERROR


def test_http_receiver_gets_spans_flushed_at_shutdown(
    http_receiver: tuple[str, Sink], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint, sink = http_receiver
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{endpoint}/v1/traces")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")  # only the shutdown flush can deliver them
    port = free_port()
    cmd = [
        sys.executable,
        str(HERE / "scripted_server.py"),
        "--port",
        str(port),
        "--log-stats-interval-ms",
        "0",
    ]
    url, process = start_server(cmd, tmp_path / "server.log", port)
    try:
        body = {
            "model": "ninfer-tiny-dense",
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "[[plain]] hello"}],
        }
        reply = httpx.post(f"{url}/v1/messages", json=body, headers={"X-Session-Id": "s-1"}, timeout=30)
        assert reply.status_code == 200, reply.text
        time.sleep(0.3)
        assert sink.spans == []  # still batched
    finally:
        stop_server(process)
    spans = sink.wait(lambda got: len(_server_spans(got)) >= 1, timeout=5)
    (span,) = _server_spans(spans)
    assert span.service == "ninfer"  # the default service.name
    attrs = span.attributes
    assert attrs["ninfer.api"] == "anthropic.messages" and attrs["gen_ai.conversation.id"] == "s-1"
    assert attrs["gen_ai.usage.output_tokens"] == reply.json()["usage"]["output_tokens"]
    assert attrs["gen_ai.response.finish_reasons"] == ["stop"]
    children = {r.span.name for r in spans if r.span.parent_span_id == span.span.span_id}
    assert children == {"ninfer.prefill", "ninfer.decode"}  # the scripted engine reports no queue time
