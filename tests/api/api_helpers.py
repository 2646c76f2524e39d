"""Helpers for the API tests (server processes on 127.0.0.1); the session fixtures are in conftest.py.

The module name is unique on purpose: test files import it by name, and several test folders have a
conftest.py, so `from conftest import ...` could resolve to another folder's.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
VENV_BIN = Path(sys.executable).parent
API_KEY = "test-key-123"


@dataclass(frozen=True)
class Server:
    url: str
    process: subprocess.Popen[bytes]
    log: Path  # stderr/stdout of the process
    request_log: Path | None = None

    @property
    def v1(self) -> str:
        return f"{self.url}/v1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(
    cmd: list[str], log: Path, port: int, *, timeout: float = 120.0
) -> tuple[str, subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return url, process
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"server did not become healthy in {timeout}s:\n{log.read_text()[-4000:]}")


def stop_server(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
