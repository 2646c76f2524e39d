"""ninfer-monitor end to end in one process: it tails a request log, polls a /stats server, reads an
nvidia-smi on PATH, and serves /api/samples, /metrics, /healthz and the page; flags and MONITOR_* variables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from monitor_helpers import StatsServer, fake_nvidia_smi, free_port, get, request_done, wait_until
from prometheus_client.parser import text_string_to_metric_families

from monitor.cli import parse_config
from monitor.sidecar.server import Monitor, MonitorConfig
from monitor.sidecar.sources import parse_nvidia_smi, read_gpus


def test_flags_override_monitor_environment_variables_which_override_defaults() -> None:
    env = {"MONITOR_PORT": "9100", "MONITOR_JSONL": "/var/log/x.jsonl", "MONITOR_INTERVAL": "2.5",
           "MONITOR_SERVER_URL": "http://srv:8080"}  # fmt: skip
    config = parse_config(["--port", "9200"], env)
    assert config.port == 9200 and config.interval == 2.5 and config.jsonl == Path("/var/log/x.jsonl")
    assert config.stats_endpoint == "http://srv:8080/stats"
    operator = [
        "--bind",
        "0.0.0.0",
        "--port",
        "8090",
        "--server-url",
        "http://127.0.0.1:8080",
        "--jsonl",
        "/var/log/ninfer/requests.jsonl",
    ]  # fmt: skip  (the operator's command line)
    config = parse_config(operator, {})
    assert (config.bind, config.port, config.jsonl) == (
        "0.0.0.0",
        8090,
        Path("/var/log/ninfer/requests.jsonl"),
    )
    assert (
        parse_config(["--stats-url", "http://127.0.0.1:8081"], {}).stats_endpoint
        == "http://127.0.0.1:8081/stats"
    )
    with pytest.raises(SystemExit):
        parse_config([], {"MONITOR_INTERVAL": "0"})


def test_nvidia_smi_is_optional_and_parsed_when_present(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert read_gpus() == []
    fake_nvidia_smi(tmp_path / "bin")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    (gpu,) = read_gpus()
    assert gpu["name"] == "NVIDIA H200" and gpu["util_pct"] == 87 and gpu["power_w"] == 512.5
    assert parse_nvidia_smi("0, X, [N/A], 1, 2, [N/A], 3, 4")[0]["util_pct"] is None


def test_sidecar_serves_samples_metrics_and_health(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvidia_smi(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    log = tmp_path / "requests.jsonl"
    log.write_text(
        json.dumps({"event": "server_start", "served_model_id": "tiny", "timestamp_unix_ms": 1}) + "\n"
    )
    stats = StatsServer()
    monitor = Monitor(MonitorConfig(port=0, server_url=stats.url, jsonl=log, interval=0.2))
    monitor.start()
    base = f"http://127.0.0.1:{monitor.port}"
    try:
        with log.open("a") as f:
            for i in range(8):
                f.write(json.dumps(request_done(i)) + "\n")
            f.write(json.dumps({"event": "request_rejected", "code": "server_overloaded"}) + "\n")
        wait_until(lambda: len(json.loads(get(base + "/api/samples"))["events"]) == 8, 10, "8 request events")
        wait_until(
            lambda: json.loads(get(base + "/api/samples"))["latest"]["decode_tps"], 10, "a decode rate"
        )
        doc = json.loads(get(base + "/api/samples"))
        assert doc["server"]["up"] is True and doc["server"]["model"] == "tiny"
        latest, agg = doc["latest"], doc["aggregates"]
        assert latest["running"] == 1 and latest["waiting"] == 2 and latest["kv_usage"] == 0.25
        assert latest["decode_tps"] > 0 and latest["prefill_tps"] > latest["decode_tps"]
        assert latest["gpu"][0]["mem_total_mb"] == 143771
        assert agg["requests"] == {"done": 8, "rejected": 1, "errors": 0}
        assert agg["ttft_p50"] == pytest.approx(0.275)
        assert agg["prefix_hit_rate"] == pytest.approx(4 * 256 / 8000)
        assert agg["mtp_accept_rate"] == pytest.approx(0.5) and agg["mtp_tokens_per_round"] == pytest.approx(
            2.5
        )
        assert agg["reuse_paths"] == {"none": 4, "checkpoint": 2, "host_restore": 2}
        assert get(base + "/healthz") == b"ok\n"
        values = {(s.name, tuple(sorted(s.labels.items()))): s.value
                  for fam in text_string_to_metric_families(get(base + "/metrics").decode()) for s in fam.samples}  # fmt: skip
        assert values[("ninfer_monitor_server_up", ())] == 1
        assert values[("ninfer_monitor_ttft_seconds", (("percentile", "50"),))] == pytest.approx(0.275)
        assert values[("ninfer_monitor_spec_acceptance_ratio", ())] == pytest.approx(0.5)
        assert values[("ninfer_monitor_gpu_utilization_ratio", (("gpu", "0"),))] == pytest.approx(0.87)
        assert values[("ninfer_monitor_log_lines_total", ())] == 10
        assert b"<svg" in get(base + "/") or b"data-chart" in get(base + "/")
        assert json.loads(get(base + "/api/samples?limit=1"))["samples"].__len__() == 1
    finally:
        monitor.stop()
        stats.close()


def test_server_down_is_reported_not_fatal(tmp_path: Path) -> None:
    monitor = Monitor(MonitorConfig(port=0, server_url=f"http://127.0.0.1:{free_port()}", interval=0.1,
                                    stats_timeout=0.5, stale_after=0.5))  # fmt: skip
    monitor.start()
    try:
        base = f"http://127.0.0.1:{monitor.port}"
        wait_until(lambda: len(json.loads(get(base + "/api/samples"))["samples"]) >= 2, 10, "two samples")
        doc = json.loads(get(base + "/api/samples"))
        assert doc["server"]["up"] is False and doc["latest"]["running"] is None
        assert get(base + "/healthz") == b"ok\n"
    finally:
        monitor.stop()


def test_the_console_script_starts_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "MONITOR_PORT": str(port), "MONITOR_INTERVAL": "0.2"}
    proc = subprocess.Popen([sys.executable, "-m", "monitor.cli", "--bind", "127.0.0.1"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_until(lambda: get(f"http://127.0.0.1:{port}/healthz") == b"ok\n", 15, "ninfer-monitor /healthz")
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 0, out
    assert b"ninfer-monitor on http://127.0.0.1:" in out
