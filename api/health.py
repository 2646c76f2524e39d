"""`GET /health` (liveness), `GET /ready` (readiness), `GET /stats` (statistics as JSON) and `GET /metrics`.

`/health` is liveness: 200 while the process serves HTTP and the engine loop has not failed (also while
draining), 503 once the engine has failed. `/ready` is readiness: 200 only while the server takes new
requests; 503 with `status` `warming_up` (before the engine has started), `draining` (after SIGTERM) or
`unavailable` (the engine failed), so a load balancer stops sending traffic before the refusals start.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from api.state import server_state
from monitor import collect
from monitor.metrics import CONTENT_TYPE

router = APIRouter()


def stats_dict(stats: Any) -> Any:
    """Engine statistics as plain JSON data (a dataclass, a mapping or an object with attributes)."""
    if dataclasses.is_dataclass(stats) and not isinstance(stats, type):
        return dataclasses.asdict(stats)
    if isinstance(stats, dict):
        return stats
    if hasattr(stats, "__dict__"):
        return {k: v for k, v in vars(stats).items() if not k.startswith("_")}
    return stats


@router.get("/health")
async def get_health(request: Request) -> JSONResponse:
    state = server_state(request)
    failed = getattr(state.engine, "error", None) is not None
    if failed:
        return JSONResponse({"status": "unavailable"}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/ready")
async def get_ready(request: Request) -> JSONResponse:
    state = server_state(request)
    if getattr(state.engine, "error", None) is not None:
        status = "unavailable"
    elif getattr(request.app.state, "draining", False):
        status = "draining"
    elif not state.ready:
        status = "warming_up"
    else:
        return JSONResponse({"status": "ready"})
    return JSONResponse({"status": status}, status_code=503, headers={"Retry-After": "1"})


@router.get("/stats")
async def get_stats(request: Request) -> JSONResponse:
    state = server_state(request)
    return JSONResponse(
        {
            "schema": "ninfer_serve_stats",
            "timestamp_unix_ms": int(time.time() * 1000),
            "http": {
                "in_flight": state.in_flight,
                "max_in_flight": state.max_in_flight,
                "requests": state.num_requests,
                "errors": state.num_errors,
                "prompt_tokens": state.prompt_tokens_total,
                "completion_tokens": state.completion_tokens_total,
            },
            "engine": stats_dict(state.engine.stats()),
            "load": {
                "model_id": state.engine.model_id,
                "served_model_id": state.served_model_id,
                "artifact": state.artifact,
                "synthetic": state.synthetic,  # geometry name when the weights are random, else null
                "load_seconds": state.load_seconds,
                "uptime_seconds": time.time() - state.started_at,
            },
            "response_store": {"records": len(state.store), "bytes": state.store.num_bytes},
            "request_log": None if state.request_log is None else state.request_log.stats(),
        }
    )


@router.get("/metrics")
async def get_metrics(request: Request) -> Response:
    """Every metric of `monitor/metrics.py`, with the engine gauges and counters refreshed at scrape time."""
    state = server_state(request)
    collect.observe_engine(state.metrics, state.engine.stats(), in_flight=state.in_flight)
    return Response(state.metrics.render(), media_type=CONTENT_TYPE)
