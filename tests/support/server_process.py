"""Start and stop a real server process on 127.0.0.1 and wait for its /health: the one implementation that
tests/api (api_helpers.py) and the resilience and load tests (ninfer_proc.py) share. tests/support is on
pytest's `pythonpath` (pyproject.toml), so test files import these modules by their unique names.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_process(
    cmd: list[str], log: Path, url: str, *, timeout: float = 120.0, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Run `cmd` with its output in `log` (and `env` added to the environment); return once `url`/health
    answers 200 (raise with the log's tail if the process exits first or `timeout` seconds pass)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log, "wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"server did not become healthy in {timeout}s:\n{log.read_text()[-4000:]}")


def stop_process(process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """SIGTERM (the graceful drain), then SIGKILL after `timeout` seconds."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
