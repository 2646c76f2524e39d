"""A real `ninfer-serve` process on 127.0.0.1 for the resilience, fuzz and load tests, plus the checks
every such test ends with: the engine is healthy (0 running, every page free or reclaimable) and the
request log accounts for every request (one start, exactly one ending).

Lives in tests/support (on pytest's pythonpath) so tests/resilience and tests/loadtest import it by name.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from server_process import free_port, start_process, stop_process

VENV_BIN = Path(sys.executable).parent
MODEL = "ninfer-tiny-dense"
TERMINAL_EVENTS = ("request_done", "request_rejected")


@dataclass(frozen=True)
class Server:
    url: str
    process: subprocess.Popen[bytes]
    log: Path  # stdout/stderr of the process
    request_log: Path
    max_context: int

    @property
    def v1(self) -> str:
        return f"{self.url}/v1"


@contextmanager
def serve(
    root: Path,
    *flags: str,
    max_context: int = 512,
    prefix: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> Iterator[Server]:
    """`ninfer-serve` (demo model) with a request log under `root`; stopped (SIGTERM) on exit. `prefix` runs
    it under a wrapper (`prlimit --fsize=N --`); `env` adds environment variables."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    request_log = root / "requests.jsonl"
    cmd = [
        *prefix,
        str(VENV_BIN / "ninfer-serve"),
        "--port", str(port),
        "--max-context", str(max_context),
        "--default-max-tokens", "8",
        "--request-log-jsonl", str(request_log),
        "--log-stats-interval-ms", "0",
        "--log-level", "warning",
        *flags,
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    process = start_process(cmd, root / "server.log", url, env=env)
    try:
        yield Server(url, process, root / "server.log", request_log, max_context)
    finally:
        stop_process(process)


def stats(server: Server) -> dict[str, Any]:
    response = httpx.get(f"{server.url}/stats", timeout=10)
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def wait_idle(server: Server, timeout: float = 60.0) -> dict[str, Any]:
    """Poll /stats until nothing runs, waits or is in flight; return that snapshot."""
    deadline = time.monotonic() + timeout
    while True:
        snap = stats(server)
        engine, http = snap["engine"], snap["http"]
        if engine["num_running"] == 0 and engine["num_waiting"] == 0 and http["in_flight"] == 0:
            return snap
        if time.monotonic() > deadline:
            raise AssertionError(f"engine not idle after {timeout}s: {json.dumps(snap)[:2000]}")
        time.sleep(0.1)


def assert_healthy(server: Server) -> None:
    """0 running / waiting / in flight, and every KV page free. Pages held only by prefix checkpoints are
    reclaimable, so with checkpoints present a probe whose prompt needs every page must still run."""
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    engine = wait_idle(server)["engine"]
    if engine["num_checkpoints"] == 0:
        assert engine["num_pages_used"] == 0, engine
        return
    num_words = engine["num_pages"] * engine["page_size"] - 40  # chat template overhead < 40 tokens
    num_words = min(num_words, server.max_context - 40)
    body = {
        "model": MODEL,
        "max_tokens": 1,
        "messages": [{"role": "user", "content": "hello" + " hello" * (num_words - 1)}],
    }
    response = httpx.post(f"{server.v1}/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] > (engine["num_pages"] - 1) * engine["page_size"], usage
    after = wait_idle(server)["engine"]
    assert after["num_pages_used"] <= after["num_pages"], after


def read_log(server: Server) -> list[dict[str, Any]]:
    return [json.loads(line) for line in server.request_log.read_text().splitlines() if line.strip()]


def assert_log_accounts(server: Server, *, min_requests: int = 0) -> list[dict[str, Any]]:
    """Every request id in the log has exactly one ending; every started request ended. Returns the
    terminal records. `min_requests`: at least this many requests are in the log."""
    records = read_log(server)
    starts = Counter(r["request_id"] for r in records if r["event"] == "request_start")
    ends = Counter(r["request_id"] for r in records if r["event"] in TERMINAL_EVENTS)
    assert all(n == 1 for n in starts.values()), [k for k, n in starts.items() if n > 1]
    duplicated = {k: n for k, n in ends.items() if n > 1}
    assert not duplicated, f"requests with several endings: {duplicated}"
    unfinished = set(starts) - set(ends)
    assert not unfinished, f"started but never ended: {sorted(unfinished)[:10]}"
    assert len(ends) >= min_requests, f"{len(ends)} requests in the log, expected >= {min_requests}"
    return [r for r in records if r["event"] in TERMINAL_EVENTS]
