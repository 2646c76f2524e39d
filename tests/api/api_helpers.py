"""Helpers for the API tests (server processes on 127.0.0.1); the session fixtures are in conftest.py.

The module name is unique on purpose: test files import it by name, and several test folders have a
conftest.py, so `from conftest import ...` could resolve to another folder's.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from server_process import free_port, start_process, stop_process

__all__ = ["API_KEY", "HERE", "VENV_BIN", "Server", "free_port", "start_server", "stop_server"]

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


def start_server(
    cmd: list[str], log: Path, port: int, *, timeout: float = 120.0
) -> tuple[str, subprocess.Popen[bytes]]:
    url = f"http://127.0.0.1:{port}"
    return url, start_process(cmd, log, url, timeout=timeout)


def stop_server(process: subprocess.Popen[bytes]) -> None:
    stop_process(process, timeout=20)
