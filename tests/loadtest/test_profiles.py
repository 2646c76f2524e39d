"""Every Locust profile runs headless for a few seconds against a real `ninfer-serve` through
`loadtest/run.py` (the `locust` CLI in a subprocess) and writes its results: summary.json with
p50/p90/p99 overall and per group, goodput and cached share; summary.csv; records.jsonl; Locust's own
CSVs with the custom TTFT / TPOT / ITL / TOKENS events; with the server's request log, its queue / prefill
split by prefix-reuse path. `agent_sessions_long` has 0 failed requests and
cached prompt tokens on every turn after the first. The engine is idle and healthy afterwards."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ninfer_proc import Server, assert_healthy, assert_log_accounts

ROOT = Path(__file__).resolve().parents[2]

# profile -> (run time, --param overrides): tiny sizes, a few seconds each.
RUNS: dict[str, tuple[str, list[str]]] = {
    "agent_sessions_long": ("9s", []),
    "park_resume": ("6s", ["turns=2", "think_time_s=[0.2,0.6]"]),
    "shared_prefix_fanout": ("4s", []),
    "prefill_ladder": ("4s", ["rungs=[32,64,128]"]),
    "chat_mix": ("4s", []),
    "rate_sweep": ("5s", ['stages=[{"rate":1,"duration_s":2},{"rate":3,"duration_s":2}]']),
}


# plots beyond ITL/TPOT and TTFT-vs-prompt that a profile's records must give
PNGS = {
    "park_resume": {"cached_share_by_turn.png"},
    "agent_sessions_long": {"cached_share_by_turn.png"},
}


def _run(server: Server, profile: str, out: Path) -> dict[str, Any]:
    run_time, params = RUNS[profile]
    cmd = [
        sys.executable, str(ROOT / "loadtest" / "run.py"), profile,
        "--host", server.url, "--run-time", run_time, "--stop-timeout", "20", "--results", str(out),
        "--server-request-log", str(server.request_log),
        *[arg for p in params for arg in ("--param", p)],
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return summary


@pytest.mark.parametrize("profile", list(RUNS))
def test_profile_runs_and_writes_results(load_server: Server, tmp_path: Path, profile: str) -> None:
    summary = _run(load_server, profile, tmp_path)
    overall = summary["overall"]
    assert summary["profile"] == profile and overall["requests"] > 0 and overall["failed"] == 0, overall
    for key in ("ttft_s", "e2e_s"):
        assert all(overall[key][q] is not None for q in ("p50", "p90", "p99")), overall[key]
    assert overall["ttft_s"]["p50"] <= overall["ttft_s"]["p99"]
    assert 0.0 <= overall["cached_token_share"] <= 1.0 and 0.0 <= overall["goodput"]["share"] <= 1.0
    assert summary["by_group"] and all(g["requests"] > 0 for g in summary["by_group"].values())
    assert summary["server"]["engine"]["num_requests_added"] >= overall["requests"]
    rows = list(csv.DictReader(open(tmp_path / "summary.csv")))
    assert rows[0]["group"] == "overall" and len(rows) == 1 + len(summary["by_group"]) + len(
        summary.get("by_kind", {})
    )
    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert len(records) == overall["requests"]
    assert all(r["output_tokens"] >= 1 and r["prompt_tokens"] > 0 for r in records)
    html = (tmp_path / "locust.html").read_text()
    assert "<html" in html.lower() and "TTFT" in html  # Locust's own report, with the custom events
    expected_pngs = {"itl_tpot.png", "ttft_vs_prompt.png"} | PNGS.get(profile, set())
    assert expected_pngs <= set(summary["reports"]) and "locust.html" in summary["reports"]
    assert all((tmp_path / name).stat().st_size > 0 for name in summary["reports"])
    kinds = {row["Type"] for row in csv.DictReader(open(tmp_path / "locust_stats.csv"))}
    assert {"STREAM", "TTFT", "TOKENS"} <= kinds, kinds
    paths = summary["server_requests"]["by_reuse_path"]  # the server's log, this run only
    assert sum(p["requests"] for p in paths.values()) <= summary["server"]["engine"]["num_requests_added"]
    assert all(p["prefill_s"]["count"] == p["requests"] for p in paths.values()), paths
    if profile == "agent_sessions_long":
        later = summary["later_turns"]
        assert later["requests"] > 0 and later["without_cached_tokens"] == 0, later
        reused = paths["checkpoint"]  # later turns continue from the device prefix cache
        assert reused["requests"] >= later["requests"] and reused["cached_tokens"]["mean"] > 0, paths
        assert "resumed_vs_cold_prefill_p50" in summary["server_requests"]
        assert {r["api"] for r in records} == {"openai", "anthropic"}
    if profile == "shared_prefix_fanout":
        assert overall["cached_token_share"] > 0.3
    if profile == "park_resume":
        assert "cold" in summary["by_kind"]
        # drawn whenever a resumed turn finished within the short run
        assert ("ttft_resumed_vs_cold.png" in summary["reports"]) == ("resumed" in summary["by_kind"])
    if profile == "rate_sweep":
        assert "max_rate_meeting_slo" in summary and len(summary["by_group"]) >= 1
    assert_healthy(load_server)
    assert_log_accounts(load_server)


def _locust(*args: str, env: dict[str, str], timeout: int = 60) -> subprocess.CompletedProcess[str]:
    locust = str(Path(sys.executable).with_name("locust"))
    return subprocess.run([locust, "-f", str(ROOT / "loadtest" / "locustfile.py"), *args], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT / "loadtest")  # fmt: skip


def test_locust_lists_the_profiles_and_runs_the_named_one(load_server: Server, tmp_path: Path) -> None:
    """`locust -f loadtest/locustfile.py` the Locust way: --list shows one User class per profile, and a
    named class runs that profile (no NINFER_LOAD_PROFILE); classes of two profiles are refused."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("NINFER_LOAD_")}
    listed = _locust("--list", env=env)
    assert listed.returncode == 0, listed.stderr
    names = set(listed.stdout.split())
    assert {
        "AgentSessionsLong",
        "ParkResume",
        "SharedPrefixFanout",
        "PrefillLadder",
        "ChatMix",
        "RateSweep",
    } <= names
    env["NINFER_LOAD_RESULTS"] = str(tmp_path)
    run = _locust("PrefillLadder", "--headless", "-u", "1", "-r", "1", "-t", "3s", "--host", load_server.url,
                  "--stop-timeout", "20", env={**env, "NINFER_LOAD_PARAMS": '{"rungs": [32, 64]}'})  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["profile"] == "prefill_ladder" and summary["overall"]["requests"] > 0
    both = _locust("ChatMix", "ParkResume", "--headless", "-t", "1s", "--host", load_server.url, env=env)
    assert both.returncode != 0 and "name one" in both.stderr
