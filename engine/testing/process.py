"""A real server process on 127.0.0.1: pick a free port, start a command and wait until it answers, stop it with
the graceful drain. The one implementation that `ninfer-bench --server` (engine/testing/bench/server.py) and the
tests (tests/support/server_process.py: tests/api, the resilience and load tests) share.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_status(url: str, timeout: float = 2.0) -> int:
    """The HTTP status of a GET of ``url`` (OSError when nothing answers)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def start_process(
    cmd: list[str],
    log: Path,
    url: str,
    *,
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
    probe: str = "/health",
) -> subprocess.Popen[bytes]:
    """Run ``cmd`` with its output in ``log`` (and ``env`` added to the environment); return once
    ``url`` + ``probe`` answers 200. RuntimeError with the log's tail if the process exits first or ``timeout``
    seconds pass (the process is stopped then)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log, "wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{cmd[0]} exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if http_status(f"{url}{probe}", timeout=1.0) == 200:
                return process
        except OSError:
            pass
        time.sleep(0.2)
    stop_process(process, timeout=5.0)
    raise RuntimeError(f"{cmd[0]} did not answer {probe} in {timeout:.0f}s:\n{log.read_text()[-4000:]}")


def stop_process(process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """SIGTERM (the server drains), then SIGKILL after ``timeout`` seconds."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
