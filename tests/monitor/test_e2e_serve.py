"""The issue's end-to-end check: a real Prometheus scrapes a running `ninfer-serve` on the demo model, and
the `ninfer-monitor` sidecar that tails its request log and polls its /stats, during a short load; every
dashboard panel expression on NInfer metrics returns data through Prometheus' HTTP API."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

from monitor_helpers import Prometheus, finite_values, free_port, get, running, wait_until
from test_prometheus import ninfer_expressions

from monitor.sidecar.server import Monitor, MonitorConfig

# series the demo model's load really moves: these must be finite numbers, not just present
MUST_BE_FINITE = ("Requests / s by finish reason", "TTFT p95", "Generation tokens / s", "End-to-end request latency",
                  "Engine tokens / s (live, per step)", "Sidecar rolling TTFT (window)")  # fmt: skip


def chat(base: str, i: int) -> None:
    body = {"model": "ninfer-tiny-dense", "max_tokens": 12, "stream": i % 2 == 0,
            "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": f"count {i}"}]}  # fmt: skip
    request = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as r:  # noqa: S310 - loopback
        r.read()


def test_prometheus_scrapes_ninfer_serve_and_sidecar_under_load(tmp_path: Path) -> None:
    port, log = free_port(), tmp_path / "requests.jsonl"
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "api.serve", "--port", str(port), "--max-concurrency", "2",
         "--request-log-jsonl", str(log), "--log-stats-interval-ms", "1000"],
        stdout=(tmp_path / "serve.log").open("w"), stderr=subprocess.STDOUT, env=dict(os.environ), cwd=tmp_path,
    )  # fmt: skip
    monitor = prom = None
    with running(server):
        try:
            wait_until(lambda: get(base + "/health") == b'{"status":"ok"}', 120, "ninfer-serve /health")
            monitor = Monitor(MonitorConfig(port=0, server_url=base, jsonl=log, interval=0.5))
            monitor.start()
            prom = Prometheus(tmp_path / "prom", {"ninfer": [f"127.0.0.1:{port}"],
                                                  "ninfer-monitor": [f"127.0.0.1:{monitor.port}"]})  # fmt: skip
            wait_until(lambda: len(prom.targets_up()) == 2 and set(prom.targets_up().values()) == {"up"}, 30,
                       "both targets up")  # fmt: skip
            exposed = get(base + "/metrics").decode()
            assert "ninfer_requests_total" in exposed, (
                "ninfer-serve's /metrics does not serve monitor.metrics.ServerMetrics yet (api wiring missing)"
            )
            stop = threading.Event()

            def load(worker: int) -> None:
                i = worker
                while not stop.is_set():
                    chat(base, i)
                    i += 2

            workers = [threading.Thread(target=load, args=(w,), daemon=True) for w in range(2)]
            for w in workers:
                w.start()
            exprs = ninfer_expressions()
            if shutil.which("nvidia-smi") is None:  # no GPU here: the sidecar has no nvidia-smi readings
                gpu_only = [e for e in exprs if "ninfer_monitor_gpu_" in e[2]]
                assert len(gpu_only) == 5  # covered with an nvidia-smi on PATH by test_prometheus.py
                exprs = [e for e in exprs if e not in gpu_only]
            missing: list[str] = []

            def all_have_data() -> bool:
                missing[:] = [f"{d} / {t}: {e}" for d, t, e in exprs if not prom.query(e)]
                missing.extend(f"(not finite) {d} / {t}: {e}" for d, t, e in exprs
                               if t in MUST_BE_FINITE and not finite_values(prom.query(e)))  # fmt: skip
                return not missing

            try:
                wait_until(all_have_data, 45, "every NInfer panel expression to return data", interval=1)
            except AssertionError:
                raise AssertionError("panels without data:\n" + "\n".join(missing)) from None
            finally:
                stop.set()
                for w in workers:
                    w.join(60)
            assert (
                json.loads(get(f"http://127.0.0.1:{monitor.port}/api/samples"))["aggregates"]["requests"][
                    "done"
                ]
                > 0
            )
        finally:
            if prom is not None:
                prom.close()
            if monitor is not None:
                monitor.stop()
