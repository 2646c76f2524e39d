"""The sidecar's page, rendered by headless Chromium (Debian's package): the DOM after its scripts ran shows
every chart with data points and the aggregates; the screenshot is kept in the test's tmp dir."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from monitor_helpers import StatsServer, fake_nvidia_smi, get, request_done, tool, wait_until

from monitor.sidecar.server import Monitor, MonitorConfig

CHARTS = ("throughput", "ttft", "queue", "prefix", "kv", "host_cache", "mtp", "gpu")


def chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess[str]:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-quic", f"--user-data-dir={profile}", "--window-size=1400,1800",
             "--virtual-time-budget=3000"]  # fmt: skip
    return subprocess.run([tool("chromium"), *flags, *args], capture_output=True, text=True, timeout=90)


def test_page_renders_charts_with_data_in_headless_chromium(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvidia_smi(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    log = tmp_path / "requests.jsonl"
    log.write_text("".join(json.dumps(request_done(i)) + "\n" for i in range(10)))
    stats = StatsServer()
    monitor = Monitor(MonitorConfig(port=0, server_url=stats.url, jsonl=log, interval=0.2))
    monitor.start()
    url = f"http://127.0.0.1:{monitor.port}/"
    try:
        wait_until(lambda: len(json.loads(get(url + "api/samples"))["samples"]) >= 4, 15, "four samples")
        page = get(url).decode()
        assert not re.search(r"""(src|href)=["']https?://""", page), (
            "the page must load nothing from elsewhere"
        )
        done = chromium(["--dump-dom", url], tmp_path / "profile-dom")
        dom = done.stdout
        assert 'data-rendered="' in dom, done.stderr[-2000:]
        for chart in CHARTS:
            m = re.search(rf'data-chart="{chart}"[^>]*data-points="(\d+)"', dom) or re.search(
                rf'data-points="(\d+)"[^>]*data-chart="{chart}"', dom
            )
            assert m and int(m.group(1)) > 0, f"chart {chart} has no data points"
        assert dom.count("<polyline") >= len(CHARTS)
        assert re.search(r'id="agg-requests">10<', dom)
        assert re.search(r'id="agg-ttft-p50">0\.3\d*<', dom)
        assert re.search(r'id="agg-mtp-accept">0\.5\d*<', dom)
        assert 'class="up">server up<' in dom
        assert dom.count("<tr><td>req_") == 10
        shot = tmp_path / "ninfer-monitor.png"
        chromium([f"--screenshot={shot}", url], tmp_path / "profile-shot")
        assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        monitor.stop()
        stats.close()
