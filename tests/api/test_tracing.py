"""OpenTelemetry request spans, read from an in-memory exporter: real requests to the real app and engine
(the embedded demo model, in process through TestClient) for Chat Completions, Messages and Responses,
streamed and not, a refused request, prefix reuse, and tracing switched off when nothing configures it."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from api.app import create_app
from api.engine_client import load_engine
from api.serve import parse_args
from api.tracing import RequestTracing, exporter_names
from engine.testing.demo import demo_artifact_path

MODEL = "tiny-alias"
SESSION = "session-42"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
HEADERS = {"X-Session-Id": SESSION, "traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
USER = "Tell me a short story about a lighthouse keeper and a seagull, please."


@dataclasses.dataclass
class Traced:
    client: TestClient
    exporter: InMemorySpanExporter
    request_log: Path

    def post(self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
        self.exporter.clear()
        response = self.client.post(path, json=body, headers=headers or HEADERS)
        return response

    def request_span(self) -> ReadableSpan:
        spans = [s for s in self.exporter.get_finished_spans() if s.kind is SpanKind.SERVER]
        assert len(spans) == 1, [s.name for s in self.exporter.get_finished_spans()]
        return spans[0]

    def children(self, parent: ReadableSpan) -> dict[str, ReadableSpan]:
        assert parent.context is not None
        return {
            s.name: s
            for s in self.exporter.get_finished_spans()
            if s.parent is not None and s.parent.span_id == parent.context.span_id
        }


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traced]:
    request_log = tmp_path_factory.mktemp("tracing") / "requests.jsonl"
    _, config, options = parse_args(
        ["--max-context", "384", "--max-concurrency", "2", "--default-max-tokens", "8", "--model-id", MODEL,
         "--request-log-jsonl", str(request_log), "--log-stats-interval-ms", "0"]
    )  # fmt: skip
    artifact = str(demo_artifact_path())
    engine = load_engine(artifact, dataclasses.replace(config, artifact=artifact), options.sampling)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = create_app(engine, options, artifact=artifact, tracing=RequestTracing(provider))
    with TestClient(app) as client:
        yield Traced(client, exporter, request_log)


def _check_request_span(span: ReadableSpan, *, api: str, usage: tuple[int, int], stream: bool) -> None:
    attrs = dict(span.attributes or {})
    assert span.name == f"chat {MODEL}"
    assert span.kind is SpanKind.SERVER
    assert span.status.status_code is StatusCode.UNSET
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.provider.name"] == "ninfer"
    assert attrs["gen_ai.request.model"] == MODEL
    assert attrs["gen_ai.response.model"] == MODEL
    assert attrs["gen_ai.request.stream"] is stream
    assert attrs["gen_ai.request.max_tokens"] == 8
    assert attrs["gen_ai.request.temperature"] == 0.0
    assert attrs["gen_ai.conversation.id"] == SESSION
    assert attrs["ninfer.api"] == api
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == usage
    assert usage[0] > 20 and usage[1] >= 1
    assert 0 <= attrs["gen_ai.usage.cache_read.input_tokens"] < usage[0]
    assert attrs["gen_ai.response.finish_reasons"] in (("stop",), ("length",))
    assert attrs["gen_ai.response.time_to_first_chunk"] > 0
    # It continues the caller's trace.
    assert span.context is not None and span.parent is not None
    assert f"{span.context.trace_id:032x}" == TRACE_ID and f"{span.parent.span_id:016x}" == PARENT_ID
    assert span.start_time is not None and span.end_time is not None and span.start_time < span.end_time


def _check_phases(traced: Traced, span: ReadableSpan) -> None:
    children = traced.children(span)
    assert set(children) == {"ninfer.queue", "ninfer.prefill", "ninfer.decode"}
    queue, prefill, decode = (children[n] for n in ("ninfer.queue", "ninfer.prefill", "ninfer.decode"))
    assert all(c.kind is SpanKind.INTERNAL for c in children.values())
    assert span.start_time is not None and span.end_time is not None
    slack = 50_000_000  # 50 ms: API-side and engine-side clocks are read in different threads
    times = [(c.start_time or 0, c.end_time or 0) for c in (queue, prefill, decode)]
    for start, end in times:
        assert span.start_time - slack <= start <= end <= span.end_time + slack
    assert times[0][1] == times[1][0]  # admission: queue ends where prefill begins
    assert times[1][1] == times[2][0]  # the first token: prefill ends where decode begins
    input_tokens = span.attributes["gen_ai.usage.input_tokens"]  # type: ignore[index]
    cached = span.attributes["gen_ai.usage.cache_read.input_tokens"]  # type: ignore[index]
    assert prefill.attributes is not None and decode.attributes is not None
    assert prefill.attributes["ninfer.prefill.computed_tokens"] == input_tokens - cached
    assert prefill.attributes["ninfer.prefill.reused_tokens"] == cached
    engine_s = prefill.attributes["ninfer.prefill.engine_seconds"]
    assert isinstance(engine_s, float) and 0 < engine_s * 1e9 <= times[1][1] - times[1][0] + slack
    assert decode.attributes["ninfer.decode.output_tokens"] == span.attributes["gen_ai.usage.output_tokens"]  # type: ignore[index]


def _sse_data(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


@pytest.mark.parametrize("stream", [False, True])
def test_chat_completions_span(traced: Traced, stream: bool) -> None:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"{USER} ({'streamed' if stream else 'whole'})"}],
        "max_tokens": 8,
        "temperature": 0,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    response = traced.post("/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    usage = _sse_data(response.text)[-1]["usage"] if stream else response.json()["usage"]
    span = traced.request_span()
    _check_request_span(
        span,
        api="chat.completions",
        usage=(usage["prompt_tokens"], usage["completion_tokens"]),
        stream=stream,
    )
    assert span.attributes["ninfer.request.id"] == response.headers["x-request-id"]  # type: ignore[index]
    _check_phases(traced, span)


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_messages_span(traced: Traced, stream: bool) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 8,
        "temperature": 0,
        "stream": stream,
        "messages": [{"role": "user", "content": f"{USER} (anthropic {stream})"}],
    }
    response = traced.post("/v1/messages", body)
    assert response.status_code == 200, response.text
    if stream:
        events = _sse_data(response.text)
        prompt = events[0]["message"]["usage"]["input_tokens"]
        output = next(e for e in events if e["type"] == "message_delta")["usage"]["output_tokens"]
    else:
        prompt, output = response.json()["usage"]["input_tokens"], response.json()["usage"]["output_tokens"]
    span = traced.request_span()
    cached = span.attributes["gen_ai.usage.cache_read.input_tokens"]  # type: ignore[index]
    # Anthropic's input_tokens excludes cache reads; GenAI's input_tokens includes them.
    _check_request_span(span, api="anthropic.messages", usage=(prompt + cached, output), stream=stream)
    _check_phases(traced, span)


@pytest.mark.parametrize("stream", [False, True])
def test_responses_span(traced: Traced, stream: bool) -> None:
    body = {
        "model": MODEL,
        "input": f"{USER} (responses {stream})",
        "max_output_tokens": 8,
        "temperature": 0,
        "stream": stream,
    }
    response = traced.post("/v1/responses", body)
    assert response.status_code == 200, response.text
    if stream:
        ends = ("response.completed", "response.incomplete")
        final = next(e for e in _sse_data(response.text) if e["type"] in ends)["response"]
    else:
        final = response.json()
    usage = final["usage"]
    span = traced.request_span()
    _check_request_span(
        span, api="openai.responses", usage=(usage["input_tokens"], usage["output_tokens"]), stream=stream
    )
    _check_phases(traced, span)


def test_prefix_reuse_is_an_event_and_cache_read_tokens(traced: Traced) -> None:
    messages = [
        {"role": "system", "content": "You are a terse assistant that answers about lighthouses. " * 4},
        {"role": "user", "content": USER},
    ]
    body = {"model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0}
    assert traced.post("/v1/chat/completions", body).status_code == 200
    first = traced.request_span()
    second_body = {**body, "messages": [*messages, {"role": "assistant", "content": "Once."},
                                        {"role": "user", "content": "And then?"}]}  # fmt: skip
    response = traced.post("/v1/chat/completions", second_body)
    assert response.status_code == 200
    cached = response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    span = traced.request_span()
    attrs = span.attributes or {}
    assert cached > 0 and attrs["gen_ai.usage.cache_read.input_tokens"] == cached
    assert attrs["ninfer.prefix_reuse.path"] == "checkpoint"
    (event,) = [e for e in span.events if e.name == "ninfer.prefix_reuse"]
    assert event.attributes is not None and event.attributes["ninfer.prefix_reuse.tokens"] == cached
    assert not [e for e in span.events if e.name == "ninfer.host_restore"]  # no host tier configured
    assert not [e for e in first.events if e.name == "ninfer.prefix_reuse"]
    prefill = traced.children(span)["ninfer.prefill"]
    assert prefill.attributes is not None and prefill.attributes["ninfer.prefill.reused_tokens"] == cached


def test_rejected_request_span(traced: Traced) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "lighthouse " * 500}], "max_tokens": 8}
    response = traced.post("/v1/chat/completions", body, headers={"X-Session-Id": "too-long"})
    assert response.status_code == 400
    span = traced.request_span()
    attrs = span.attributes or {}
    assert span.status.status_code is StatusCode.ERROR
    assert attrs["error.type"] == response.json()["error"]["code"] == "context_length_exceeded"
    assert attrs["http.response.status_code"] == 400
    assert attrs["gen_ai.response.finish_reasons"] == ("rejected",)
    assert attrs["gen_ai.conversation.id"] == "too-long"
    assert span.parent is None  # no traceparent: a new trace
    assert traced.children(span) == {}


def test_engine_times_reach_the_request_log_and_metrics(traced: Traced) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi there."}], "max_tokens": 2}
    assert traced.post("/v1/chat/completions", body).status_code == 200
    done = [json.loads(line) for line in traced.request_log.read_text().splitlines()]
    timings = [r["timings_seconds"] for r in done if r["event"] == "request_done"][-1]
    assert timings["queue"] >= 0 and timings["prefill"] > 0
    assert timings["queue"] + timings["prefill"] <= timings["ttft"] + 0.05
    metrics = traced.client.get("/metrics").text
    for name in ("ninfer_request_queue_seconds_count", "ninfer_request_prefill_seconds_count"):
        line = next(x for x in metrics.splitlines() if x.startswith(name))
        assert float(line.split()[-1]) >= 1, line


# ------------------------------------------------------------------------------------------- off by default


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({}, []),
        ({"OTEL_SERVICE_NAME": "x", "OTEL_RESOURCE_ATTRIBUTES": "a=b"}, []),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, ["otlp_proto_grpc"]),
        (
            {
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://h:4318/v1/traces",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            },
            ["otlp_proto_http"],
        ),
        (
            {"OTEL_TRACES_EXPORTER": "console,otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"},
            ["console", "otlp_proto_http"],
        ),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, []),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, []),
    ],
)
def test_exporters_follow_the_standard_variables(env: dict[str, str], names: list[str]) -> None:
    assert exporter_names(env) == names


def test_unknown_exporter_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no trace exporter named 'zipkin_json'"):
        RequestTracing.from_env({"OTEL_TRACES_EXPORTER": "zipkin_json"})


def test_off_unless_configured_never_loads_the_sdk() -> None:
    """Unconfigured, building the app and serving a request never imports the OpenTelemetry SDK."""
    code = """
import os, sys
for k in [k for k in os.environ if k.startswith("OTEL_")]:
    del os.environ[k]
sys.path.insert(0, sys.argv[1])
from fastapi.testclient import TestClient
from scripted import ScriptedEngine
from api.app import create_app
from api.engine_client import tokenizer_from_artifact
from api.serve import parse_args
from engine.testing.demo import demo_artifact_path
import api.tracing
def refuse(*a, **k):
    raise AssertionError("a span was started with tracing off")
api.tracing.RequestTracing.start = refuse
_, config, options = parse_args([])
model_id, tokenizer, _ = tokenizer_from_artifact(demo_artifact_path())
app = create_app(ScriptedEngine(tokenizer, model_id, config), options)
assert app.state.server.tracing is None
with TestClient(app) as client:
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry.sdk") or m.startswith("grpc"))
assert not loaded, loaded
print("ok")
"""
    here = str(Path(__file__).resolve().parent)
    result = subprocess.run(
        [sys.executable, "-c", code, here], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
