"""A real Prometheus (Debian's package, on 127.0.0.1) scrapes the sidecar's /metrics and a real exporter
process built from monitor.metrics and fed by monitor.collect; every dashboard panel expression on NInfer
metrics returns data through Prometheus' HTTP API (finite numbers, since every path is exercised)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from monitor_helpers import (
    DASHBOARDS,
    Prometheus,
    StatsServer,
    fake_nvidia_smi,
    finite_values,
    free_port,
    get,
    request_done,
    running,
    wait_until,
)  # fmt: skip

from monitor.dashboards import expressions, referenced_metrics
from monitor.metrics import EXTERNAL_METRICS
from monitor.sidecar.server import Monitor, MonitorConfig


def ninfer_expressions() -> list[tuple[str, str, str]]:
    """(dashboard, panel, expr) for every expression that uses only NInfer metrics."""
    out = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        for title, expr in expressions(json.loads(path.read_text())):
            used = referenced_metrics(expr)
            if used and not used & set(EXTERNAL_METRICS):
                out.append((path.name, title, expr))
    return out


def test_prometheus_scrapes_sidecar_and_exporter_and_every_panel_has_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvidia_smi(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    log = tmp_path / "requests.jsonl"
    log.write_text("".join(json.dumps(request_done(i)) + "\n" for i in range(12)))
    stats = StatsServer()
    monitor = Monitor(MonitorConfig(port=0, server_url=stats.url, jsonl=log, interval=0.25))
    monitor.start()
    exporter_port = free_port()
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")])}
    exporter = subprocess.Popen([sys.executable, str(here / "exporter.py"), str(exporter_port)], env=env)
    prom = None
    try:
        with running(exporter):
            wait_until(lambda: b"ninfer_requests_total" in get(f"http://127.0.0.1:{exporter_port}/metrics"), 20,
                       "the exporter")  # fmt: skip
            prom = Prometheus(tmp_path / "prom", {"ninfer": [f"127.0.0.1:{exporter_port}"],
                                                  "ninfer-monitor": [f"127.0.0.1:{monitor.port}"]})  # fmt: skip
            wait_until(lambda: set(prom.targets_up().values()) == {"up"} and len(prom.targets_up()) == 2, 30,
                       "both targets up")  # fmt: skip
            # rate() over [1m] needs two scrapes of every series; wait for the slowest panel to fill
            exprs = ninfer_expressions()
            assert len(exprs) > 60
            wait_until(lambda: finite_values(prom.query(exprs[0][2])), 30, "the first panel")
            missing: list[str] = []

            def all_have_data() -> bool:
                missing[:] = [f"{d} / {t}: {e}" for d, t, e in exprs if not finite_values(prom.query(e))]
                return not missing

            try:
                wait_until(
                    all_have_data, 30, "every NInfer panel expression to return finite data", interval=1
                )
            except AssertionError:
                raise AssertionError("panels without data:\n" + "\n".join(missing)) from None
            assert finite_values(prom.query('up{job="ninfer-monitor"}')) == [1.0]
            hit = finite_values(prom.query(exprs[[e[1] for e in exprs].index("Prefix-cache hit rate")][2]))
            assert 0 < hit[0] < 1
    finally:
        if prom is not None:
            prom.close()
        monitor.stop()
        stats.close()
