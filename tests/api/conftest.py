"""Session servers for the API tests, each a real process on 127.0.0.1 driven over real HTTP.

- `real_server`: `ninfer-serve` on the embedded demo model (the real engine), with a request log.
- `scripted_server`: the same app and flags serving `ScriptedEngine` (reasoning, tool calls, stops), with an
  API key and a short SSE keep-alive.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

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


@pytest.fixture(scope="session")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("real_server")
    port = free_port()
    request_log = root / "requests.jsonl"
    cmd = [
        str(VENV_BIN / "ninfer-serve"),
        "--port", str(port),
        "--max-context", "384",
        "--max-concurrency", "2",
        "--default-max-tokens", "16",
        "--request-log-jsonl", str(request_log),
        "--log-stats-interval-ms", "500",
        "--model-id", "tiny-alias",
    ]  # fmt: skip
    url, process = start_server(cmd, root / "server.log", port)
    yield Server(url, process, root / "server.log", request_log)
    stop_server(process)


@pytest.fixture(scope="session")
def scripted_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("scripted_server")
    port = free_port()
    cmd = [
        sys.executable, str(HERE / "scripted_server.py"),
        "--port", str(port),
        "--api-key", API_KEY,
        "--max-context", "1024",
        "--max-request-mib", "1",
        "--max-pending-requests", "0",
        "--keepalive-seconds", "0.3",
        "--log-stats-interval-ms", "0",
    ]  # fmt: skip
    url, process = start_server(cmd, root / "server.log", port)
    yield Server(url, process, root / "server.log")
    stop_server(process)
