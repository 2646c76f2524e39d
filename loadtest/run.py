#!/usr/bin/env python3
"""Run NInfer load profiles headless through the `locust` CLI and collect their results.

    python loadtest/run.py PROFILE|all [--host URL] [--scale demo|gpu] [--users N] [--run-time 30s]
                           [--param key=value ...] [--results DIR]

Per profile it scrapes the server's `/stats` before and after, runs
`locust -f loadtest/locustfile.py PROFILE_CLASS --headless ...` (Locust's own CSVs land in DIR/locust_*.csv
and its HTML report in DIR/locust.html), then adds the `/stats` deltas to DIR/summary.json under "server"
(and, with `--server-request-log`, the server's own queue / prefill seconds per prefix-reuse path under
"server_requests"), and draws DIR/*.png from the records (loadtest/plots.py: TTFT against prompt tokens,
resumed against cold TTFT, ITL and TPOT distributions, cached-token share per turn). Exit status: 0 when every profile ran without a
failed request, 1 otherwise, 2 on bad arguments. Only this wrapper imports nothing from locust, so it is
safe to call from tests.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from report import server_breakdown

HERE = Path(__file__).resolve().parent
# profile -> its User class in locustfile.py (`locust -f loadtest/locustfile.py --list`)
PROFILES = {
    "agent_sessions_long": "AgentSessionsLong",
    "park_resume": "ParkResume",
    "shared_prefix_fanout": "SharedPrefixFanout",
    "prefill_ladder": "PrefillLadder",
    "chat_mix": "ChatMix",
    "rate_sweep": "RateSweep",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="loadtest/run.py", description=__doc__.split("\n\n")[0])
    p.add_argument("profile", choices=[*PROFILES, "all"])
    p.add_argument("--host", default="http://127.0.0.1:8080", help="server base URL (no /v1)")
    p.add_argument("--scale", default="demo", help="a key of the scenario's scales (demo, gpu)")
    p.add_argument("--users", type=int, help="override the scenario's user count")
    p.add_argument("--spawn-rate", type=float, help="override the scenario's spawn rate")
    p.add_argument("--run-time", help="override the scenario's run time (Locust syntax: 30s, 5m)")
    p.add_argument("--stop-timeout", type=float, help="seconds users get to finish a turn at the end")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="JSON value")
    p.add_argument("--results", type=Path, help="results folder (default loadtest/results/<profile>-<scale>)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", help="model name to send (default: the server's first model)")
    p.add_argument("--api-key", default=os.environ.get("NINFER_API_KEY"), help="or NINFER_API_KEY")
    p.add_argument("--locust", default=str(Path(sys.executable).parent / "locust"), help="locust executable")
    p.add_argument("--server-request-log", type=Path, metavar="JSONL",
                   help="the server's --request-log-jsonl (same machine): adds its queue / prefill split by "
                   "prefix-reuse path to summary.json as server_requests")  # fmt: skip
    return p


def parse_params(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--param {item!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def server_stats(host: str, api_key: str | None) -> dict[str, Any] | None:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{host.rstrip('/')}/stats", headers=headers, timeout=10)
        return response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def stats_delta(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """Counter differences of the engine and HTTP sections (numbers and per-key dicts of numbers)."""
    if not before or not after:
        return None

    def diff(a: Any, b: Any) -> Any:
        if isinstance(a, dict) and isinstance(b, dict):
            return {k: diff(a.get(k, 0), v) for k, v in b.items()}
        if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(b, bool):
            return b - a
        return b

    return {section: diff(before.get(section, {}), after.get(section, {})) for section in ("http", "engine")}


def run_profile(args: argparse.Namespace, profile: str, params: dict[str, Any]) -> int:
    scenario = json.loads((HERE / "scenarios" / f"{profile}.json").read_text())
    if args.scale not in scenario["scales"]:
        raise SystemExit(f"{profile}: no scale {args.scale!r} (have {sorted(scenario['scales'])})")
    scale = scenario["scales"][args.scale]
    results = args.results or HERE / "results" / f"{profile}-{args.scale}"
    if args.profile == "all" and args.results is not None:
        results = args.results / profile
    results.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "NINFER_LOAD_PROFILE": profile,
        "NINFER_LOAD_SCALE": args.scale,
        "NINFER_LOAD_PARAMS": json.dumps(params),
        "NINFER_LOAD_RESULTS": str(results),
        "NINFER_LOAD_SEED": str(args.seed),
    }
    if args.model:
        env["NINFER_LOAD_MODEL"] = args.model
    if args.api_key:
        env["NINFER_API_KEY"] = args.api_key
    stop_timeout = args.stop_timeout if args.stop_timeout is not None else scale.get("stop_timeout_s", 10)
    cmd = [
        args.locust,
        "-f", str(HERE / "locustfile.py"),
        PROFILES[profile],
        "--headless",
        "--host", args.host,
        "-u", str(args.users or scale["users"]),
        "-r", str(args.spawn_rate or scale["spawn_rate"]),
        "-t", args.run_time or scale["run_time"],
        "--stop-timeout", f"{int(round(stop_timeout))}s",
        "--csv", str(results / "locust"),
        "--html", str(results / "locust.html"),
        "--only-summary",
        "--loglevel", "WARNING",
    ]  # fmt: skip
    before = server_stats(args.host, args.api_key)
    started, started_unix = time.monotonic(), time.time()
    rc = subprocess.run(cmd, env=env, cwd=HERE).returncode
    elapsed = time.monotonic() - started
    summary_path = results / "summary.json"
    if not summary_path.exists():
        print(f"{profile}: locust exited {rc} without writing {summary_path}", file=sys.stderr)
        return 1
    summary = json.loads(summary_path.read_text())
    summary["server"] = stats_delta(before, server_stats(args.host, args.api_key))
    summary["locust_exit_code"] = rc
    summary["wall_s"] = elapsed
    if args.server_request_log is not None:
        summary["server_requests"] = server_breakdown(args.server_request_log, started_unix)
    summary["reports"] = ["locust.html", *reports(results)]
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    overall = summary["overall"]
    ttft = overall["ttft_s"]["p50"]
    print(
        f"{profile}: {overall['requests']} requests, {overall['failed']} failed, "
        f"TTFT p50 {'-' if ttft is None else f'{ttft * 1000:.0f} ms'}, "
        f"cached share {overall['cached_token_share']:.2f}, goodput share {overall['goodput']['share']:.2f} "
        f"-> {results}"
    )
    return 0 if rc == 0 and overall["failed"] == 0 else 1


def reports(results: Path) -> list[str]:
    """Draw the PNGs (matplotlib, imported only here) from records.jsonl; their file names."""
    from plots import write_plots

    lines = (results / "records.jsonl").read_text().splitlines()
    return [p.name for p in write_plots(results, [json.loads(line) for line in lines if line])]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    params = parse_params(args.param)
    profiles = PROFILES if args.profile == "all" else (args.profile,)
    failures = [p for p in profiles if run_profile(args, p, params) != 0]
    if failures:
        print(f"failed: {', '.join(failures)}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
