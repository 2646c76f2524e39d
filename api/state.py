"""What every route shares: the engine, the options, the served names, the request log, counters."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from api.engine_client import EngineClient
from api.errors import ApiError
from api.options import ServerOptions
from api.request_log import RequestLog
from api.tracing import RequestTracing
from monitor.metrics import ServerMetrics


@dataclass
class ServerState:
    engine: EngineClient
    options: ServerOptions
    artifact: str | None = None
    request_log: RequestLog | None = None
    started_at: float = field(default_factory=time.time)
    load_seconds: float = 0.0
    in_flight: int = 0
    max_in_flight: int = 0
    num_requests: int = 0
    num_errors: int = 0
    prompt_tokens_total: int = 0
    completion_tokens_total: int = 0
    store: Any = None  # api.openai.store.ResponseStore
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    tracing: RequestTracing | None = None  # OpenTelemetry, when the OTEL_* variables configure it
    ready: bool = False  # the engine has started (set by the app's lifespan); GET /ready

    @property
    def synthetic(self) -> str | None:
        """The geometry name when the engine serves random weights (`--synthetic`), else None."""
        name = getattr(self.engine, "synthetic", None)
        return name if isinstance(name, str) else None

    @property
    def served_model_id(self) -> str:
        return self.options.model_id or self.engine.model_id

    def knows_model(self, name: str) -> bool:
        return name in (self.served_model_id, self.engine.model_id)

    def check_model(self, name: str | None) -> None:
        if name is not None and not self.knows_model(name):
            raise ApiError(
                404,
                "model_not_found",
                f"the model {name!r} does not exist; this server serves {self.served_model_id!r}",
                param="model",
            )

    @property
    def max_context(self) -> int:
        return self.engine.config.scheduler.max_context

    # request id -> whether its ending is logged; filled by log(), emptied by the gate (api.app) when the
    # HTTP exchange ends, which logs an ending itself for a generation request that has none.
    log_ended: dict[str, bool] = field(default_factory=dict)

    def log(self, event: str, **fields: Any) -> None:
        request_id = fields.get("request_id")
        if request_id is not None and event in ("request_start", "request_done", "request_rejected"):
            self.log_ended[request_id] = event != "request_start"
        if self.request_log is not None and not self.request_log.write(event, **fields):
            self.metrics.request_log_write_errors.inc()  # the log warned; serving goes on


def server_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.server
    return state


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"
