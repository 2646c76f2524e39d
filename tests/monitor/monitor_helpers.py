"""Shared pieces of the monitor tests: free ports, HTTP waits, a real Prometheus, a fake /stats server,
a fake `nvidia-smi`, and request-log records shaped like api/request_log.py writes them."""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "dashboards"


def tool(name: str) -> str:
    """The path of a tool `scripts/setup/30-observability.sh` installs; a missing one fails the test."""
    tools = Path(os.environ.get("NINFER_TOOLS", Path.home() / ".cache" / "ninfer-tools")) / "bin"
    path = shutil.which(name) or shutil.which(name, path=str(tools))
    assert path, f"{name} not found: run scripts/setup/30-observability.sh (make system)"
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback test URL
        return bytes(r.read())


def wait_until(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (OSError, ValueError, KeyError, TypeError) as exc:
            last = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last})")


class Prometheus:
    """A real Prometheus server (Debian's package) on 127.0.0.1 scraping `targets` every second."""

    def __init__(self, workdir: Path, targets: dict[str, list[str]]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        config = workdir / "prometheus.yml"
        jobs = "\n".join(
            f"  - job_name: {job}\n    static_configs:\n      - targets: {json.dumps(addrs)}"
            for job, addrs in targets.items()
        )
        config.write_text(
            f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n{jobs}\n"
        )
        self.log = (workdir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [tool("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        wait_until(lambda: get(self.url + "/-/ready").startswith(b"Prometheus"), 30, "Prometheus ready")

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        doc = json.loads(get(url))
        assert doc["status"] == "success", doc
        result = doc["data"]["result"]
        return result if isinstance(result, list) else [{"value": result}]

    def targets_up(self) -> dict[str, str]:
        doc = json.loads(get(self.url + "/api/v1/targets"))
        return {t["scrapeUrl"]: t["health"] for t in doc["data"]["activeTargets"]}

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def finite_values(result: list[dict[str, Any]]) -> list[float]:
    values = [float(r["value"][1]) for r in result]
    return [v for v in values if math.isfinite(v)]


class StatsServer:
    """Serves `/stats` like ninfer-serve: engine counters that grow with every call of `advance()`."""

    def __init__(self) -> None:
        self.engine: dict[str, Any] = {
            "num_running": 1, "num_waiting": 2, "max_concurrency": 4, "num_pages": 128, "num_pages_used": 32,
            "page_size": 64, "kv_dtype": "bf16", "num_checkpoints": 3, "num_prefix_hits": 0,
            "num_prefix_hit_tokens": 0, "num_prefill_tokens": 0, "num_decode_tokens": 0, "num_steps": 0,
            "num_forward_steps": 0, "num_admission_scans": 0, "num_requests_added": 0,
            "num_requests_finished": {}, "num_requests_rejected": {"server_overloaded": 1},
            "host_kv_used_bytes": 3 << 30, "host_kv_capacity_bytes": 8 << 30,
        }  # fmt: skip
        self.calls = 0
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def do_GET(self) -> None:  # noqa: N802
                with outer.lock:
                    outer.calls += 1
                    outer.advance()
                    body = json.dumps({"schema": "ninfer_serve_stats", "http": {"in_flight": 2},
                                       "engine": outer.engine,
                                       "load": {"model_id": "ninfer-tiny-dense", "served_model_id": "tiny"}}).encode()  # fmt: skip
                self.send_response(200 if self.path == "/stats" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def advance(self) -> None:
        e = self.engine
        e["num_prefill_tokens"] += 900
        e["num_decode_tokens"] += 120
        e["num_steps"] += 130
        e["num_forward_steps"] += 125
        e["num_admission_scans"] += 4

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def fake_nvidia_smi(directory: Path) -> Path:
    """An `nvidia-smi` that answers the sidecar's query like one H200 would."""
    directory.mkdir(parents=True, exist_ok=True)
    exe = directory / "nvidia-smi"
    exe.write_text("#!/bin/sh\necho '0, NVIDIA H200, 87, 120000, 143771, 512.50, 700.00, 61'\n")
    exe.chmod(0o755)
    return exe


def request_done(i: int, *, now_ms: int | None = None, protocol: str = "chat.completions") -> dict[str, Any]:
    """A `request_done` record as api/request_log.py writes it, plus the fields the issue adds
    (queue/prefill timings, host-cache hits, speculative counts)."""
    cached = 256 if i % 2 else 0
    return {
        "artifact_type": "ninfer_serve_request_log", "schema_version": 1, "event": "request_done",
        "timestamp_unix_ms": now_ms if now_ms is not None else int(time.time() * 1000),
        "server_instance_id": "inst-1", "request_id": f"req_{i}", "protocol": protocol,
        "result": {"finish_reason": "stop" if i % 3 else "length", "prompt_tokens": 1000, "completion_tokens": 50,
                   "prefix_cache_hit_tokens": cached, "host_cache_hit_tokens": 64 if i % 4 == 1 else 0,
                   "prefix_reuse_path": None},
        "timings_seconds": {"queue": 0.05 * (i % 5), "ttft": 0.2 + 0.05 * (i % 5), "decode": 1.0, "total": 1.3},
        "speculative": {"rounds": 20, "drafted_tokens": 60, "accepted_tokens": 30, "accepted_per_position": [15, 10, 5]},
    }  # fmt: skip


@contextmanager
def running(proc: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
