"""The sidecar process: a poller thread (request log, /stats, nvidia-smi, /proc) and a small HTTP server.

Routes: `GET /` (the dashboard), `GET /api/samples[?limit=N]` (JSON), `GET /metrics` (Prometheus text of
`SidecarMetrics`), `GET /healthz` (`ok` while the poller thread is alive).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from monitor.metrics import CONTENT_TYPE
from monitor.sidecar.page import render_page
from monitor.sidecar.sources import HostReader, fetch_stats, read_gpus
from monitor.sidecar.state import MonitorState
from monitor.sidecar.tail import JsonlTail

logger = logging.getLogger("ninfer.monitor")


@dataclass(frozen=True)
class MonitorConfig:
    port: int = 8090
    bind: str = "127.0.0.1"
    server_url: str = "http://127.0.0.1:8080"
    stats_url: str | None = None  # base URL of /stats (default: server_url)
    jsonl: Path | None = None
    interval: float = 5.0
    samples: int = 4320
    window: float = 3600.0
    stats_timeout: float = 15.0
    stale_after: float = 60.0

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port={self.port}: must be in 0..65535")
        if not self.interval > 0:
            raise ValueError(f"interval={self.interval}: must be > 0")
        if self.samples < 1:
            raise ValueError(f"samples={self.samples}: must be >= 1")
        if not self.window > 0:
            raise ValueError(f"window={self.window}: must be > 0")

    @property
    def stats_endpoint(self) -> str:
        base = (self.stats_url or self.server_url).rstrip("/")
        return base if base.endswith("/stats") else base + "/stats"


def clean(value: Any) -> Any:
    """JSON-safe copy: NaN and infinities become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


class Monitor:
    """Owns the state, the poller thread and the HTTP server. `start()`, then `stop()`."""

    def __init__(self, config: MonitorConfig) -> None:
        self.config = config
        self.state = MonitorState(max_samples=config.samples, window_seconds=config.window,
                                  stale_after_seconds=config.stale_after)  # fmt: skip
        self.tail = JsonlTail(config.jsonl) if config.jsonl is not None else None
        self.host = HostReader()
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll_loop, name="ninfer-monitor-poll", daemon=True)
        self.httpd = ThreadingHTTPServer((config.bind, config.port), _handler(self))
        self.httpd.daemon_threads = True
        self._serve = threading.Thread(
            target=self.httpd.serve_forever, name="ninfer-monitor-http", daemon=True
        )
        self._rotations = self._truncations = 0

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start(self) -> None:
        self._poller.start()
        self._serve.start()

    def stop(self) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._poller.join(timeout=self.config.stats_timeout + 5)
        if self.tail is not None:
            self.tail.close()

    @property
    def healthy(self) -> bool:
        return self._poller.is_alive()

    def poll_once(self) -> None:
        if self.tail is not None:
            records = self.tail.poll()
            metrics = self.state.metrics
            if self.tail.rotations > self._rotations:
                metrics.log_reopens.labels(cause="rotation").inc(self.tail.rotations - self._rotations)
                self._rotations = self.tail.rotations
            if self.tail.truncations > self._truncations:
                metrics.log_reopens.labels(cause="truncation").inc(self.tail.truncations - self._truncations)
                self._truncations = self.tail.truncations
            self.state.ingest(records)
        try:
            stats: dict[str, Any] | None = fetch_stats(self.config.stats_endpoint, self.config.stats_timeout)
        except (OSError, ValueError) as exc:
            logger.debug("poll %s failed: %s", self.config.stats_endpoint, exc)
            stats = None
        self.state.sample(stats, gpus=read_gpus(), cpu_pct=self.host.cpu_pct(), ram=self.host.ram_mb())

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.poll_once()
            except Exception:  # a bug in one poll must not end the sidecar: logged, next poll runs
                logger.exception("monitor poll failed")
            self._stop.wait(max(0.0, self.config.interval - (time.monotonic() - started)))


def _handler(monitor: Monitor) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "ninfer-monitor"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
            logger.debug("%s " + format, self.address_string(), *args)

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_HEAD(self) -> None:  # noqa: N802 - stdlib naming
            self.do_GET()

        def do_GET(self) -> None:  # noqa: N802 - stdlib naming
            url = urlsplit(self.path)
            if url.path in ("/", "/index.html"):
                doc = clean(monitor.state.snapshot(max_samples=720))
                self._send(200, render_page(doc, monitor.config.interval), "text/html; charset=utf-8")
            elif url.path == "/api/samples":
                limit = parse_qs(url.query).get("limit", [""])[0]
                max_samples = int(limit) if limit.isdigit() and int(limit) > 0 else None
                doc = clean(monitor.state.snapshot(max_samples=max_samples))
                self._send(200, json.dumps(doc, allow_nan=False).encode(), "application/json")
            elif url.path == "/metrics":
                self._send(200, monitor.state.metrics.render(), CONTENT_TYPE)
            elif url.path == "/healthz":
                ok = monitor.healthy
                self._send(200 if ok else 503, b"ok\n" if ok else b"poller stopped\n", "text/plain")
            else:
                self._send(404, b"not found\n", "text/plain")

    return Handler
