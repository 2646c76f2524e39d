"""schemathesis against the server's own OpenAPI schema (`/openapi.json`), run as a CLI subprocess and
bounded in examples and time: no server error (the `not_a_server_error` check, and no "unhandled error"
in the server log), no hang (a request past `--request-timeout` is an error here); afterwards the engine
is healthy and the request log accounts for every request."""

from __future__ import annotations

import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import httpx
from ninfer_proc import VENV_BIN, assert_healthy, assert_log_accounts, serve

# Per phase: (phase, extra flags, wall limit). Coverage walks each schema's boundaries deterministically;
# fuzzing draws random bodies until max-examples or max-time.
PHASES = (
    ("coverage", ["--max-examples", "10"], 90),
    ("fuzzing", ["--max-examples", "8", "--max-time", "20"], 90),
)


def _run_phase(url: str, phase: str, flags: list[str], limit: int, report: Path) -> tuple[int, str]:
    cmd = [
        str(VENV_BIN / "st"), "run", f"{url}/openapi.json",
        "--checks", "not_a_server_error",
        "--phases", phase,
        "--request-timeout", "30",
        "--seed", "20260101",
        "--workers", "2",
        "--no-shrink",
        "--report", "junit",
        "--report-junit-path", str(report),
        *flags,
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    return done.returncode, done.stdout[-6000:] + done.stderr[-2000:]


def _problems(report: Path) -> tuple[list[str], list[str]]:
    """(check failures, errors that are hangs or network errors) from the JUnit report."""
    failures, hangs = [], []
    for case in ET.parse(report).getroot().iter("testcase"):
        for failure in case.findall("failure"):
            failures.append(f"{case.get('name')}: {(failure.get('message') or failure.text or '')[:300]}")
        for error in case.findall("error"):
            text = f"{error.get('message') or ''} {error.text or ''}"
            if any(word in text.lower() for word in ("timeout", "timed out", "connection", "network")):
                hangs.append(f"{case.get('name')}: {text[:300]}")
    return failures, hangs


def test_schemathesis_finds_no_server_error_and_no_hang(tmp_path: Path) -> None:
    flags = ("--max-concurrency", "2", "--default-max-tokens", "4", "--max-request-mib", "1")
    with serve(tmp_path / "server", *flags, max_context=160) as server:
        schema = server.url + "/openapi.json"
        doc = httpx.get(schema, timeout=10).json()
        for path in ("/v1/chat/completions", "/v1/messages", "/v1/responses"):
            body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
            assert "messages" in body["properties"] or "input" in body["properties"], path
        for phase, extra, limit in PHASES:
            report = tmp_path / f"{phase}.xml"
            rc, output = _run_phase(server.url, phase, extra, limit, report)
            assert report.exists(), output
            failures, hangs = _problems(report)
            assert not failures, "\n".join(failures[:10]) + "\n" + output
            assert not hangs, "\n".join(hangs[:10])
            assert rc == 0 or "Runtime Error" in output, output  # schemathesis' own generation errors
        assert "unhandled error" not in server.log.read_text()
        assert_healthy(server)
        assert_log_accounts(server)
