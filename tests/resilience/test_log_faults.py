"""The request log under faults, against real servers and real files: a file-size limit (`prlimit --fsize`,
the kernel's EFBIG, as on a full disk) never fails a request and never leaves a split line; a cut-off last
line is repaired on restart; SIGKILL at random points, with restarts in between, never loses or splits a
line."""

from __future__ import annotations

import json
import random
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from ninfer_proc import MODEL, Server, serve

FSIZE_LIMIT = 20_000


def _chat(server: Server, text: str) -> httpx.Response:
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": text}]}
    return httpx.post(f"{server.v1}/chat/completions", json=body, timeout=60)


def _records(path: Path) -> list[dict]:
    """Every line of the log as JSON; fails on a split or glued line."""
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), f"the log ends mid-line: {data[-200:]!r}"
    return [json.loads(line) for line in data.splitlines()]


def test_a_full_file_never_fails_a_request_and_never_splits_a_line(tmp_path: Path) -> None:
    prefix = ("prlimit", f"--fsize={FSIZE_LIMIT}", "--")
    with serve(tmp_path, prefix=prefix) as server:
        statuses = [_chat(server, f"question {i} " + "pad " * 40).status_code for i in range(40)]
        stats = httpx.get(f"{server.url}/stats", timeout=10).json()["request_log"]
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert statuses == [200] * 40
    assert stats["write_errors"] > 0 and stats["last_error"], stats  # EFBIG, or a short write at the limit
    line = next(m for m in metrics.splitlines() if m.startswith("ninfer_request_log_write_errors_total "))
    assert float(line.split()[1]) == stats["write_errors"]
    assert server.request_log.stat().st_size <= FSIZE_LIMIT
    records = _records(server.request_log)  # whole lines only, up to the limit
    assert records[0]["event"] == "server_start" and len(records) > 3
    assert "could not be written" in server.log.read_text()


def test_restart_moves_a_cut_off_last_line_aside(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    whole = json.dumps({"event": "request_done", "request_id": "r1"}) + "\n"
    fragment = '{"event": "request_done", "request_id": "r2", "res'
    log.write_text(whole + fragment)
    with serve(tmp_path) as server:
        assert _chat(server, "hello").status_code == 200
    records = _records(log)
    assert records[0] == json.loads(whole)
    assert records[1]["event"] == "server_start"
    assert records[1]["request_log_repaired_bytes"] == len(fragment)
    assert (tmp_path / "requests.jsonl.partial").read_text() == fragment + "\n"


def test_sigkill_at_random_points_never_loses_or_splits_a_line(tmp_path: Path) -> None:
    rng = random.Random(20260101)
    answered: list[str] = []  # request ids of 200s: each must have its request_done line
    for round_index in range(3):
        with serve(tmp_path) as server:
            if round_index == 2:  # the last round ends with a clean stop
                answered += [r.headers["x-request-id"] for r in [_chat(server, "last")]]
                break

            def one(i: int, server: Server = server, tag: int = round_index) -> str | None:
                try:
                    response = _chat(server, f"round {tag} request {i}")
                except httpx.HTTPError:
                    return None  # cut by the kill
                return response.headers["x-request-id"] if response.status_code == 200 else None

            with ThreadPoolExecutor(max_workers=4) as pool:
                futures = [pool.submit(one, i) for i in range(24)]
                time.sleep(rng.uniform(0.3, 2.0))
                server.process.send_signal(signal.SIGKILL)
                server.process.wait(timeout=30)
                answered += [rid for f in futures if (rid := f.result()) is not None]
    records = _records(tmp_path / "requests.jsonl")
    done = {r["request_id"] for r in records if r["event"] == "request_done"}
    assert not set(answered) - done, f"answered but not logged: {sorted(set(answered) - done)[:5]}"
    assert sum(r["event"] == "server_start" for r in records) == 3
    partial = tmp_path / "requests.jsonl.partial"
    if partial.exists():  # a kill mid-line: the fragment was moved aside whole, on a line of its own
        assert partial.read_bytes().endswith(b"\n")
