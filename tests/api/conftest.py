"""Session servers for the API tests, each a real process on 127.0.0.1 driven over real HTTP.

- `real_server`: `ninfer-serve` on the embedded demo model (the real engine), with a request log.
- `vision_server`: `ninfer-serve --vision` on a tiny model with a tiny vision tower (engine.testing.tiny), greedy.
- `scripted_server`: the same app and flags serving `ScriptedEngine` (reasoning, tool calls, stops), with an
  API key and a short SSE keep-alive.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from api_helpers import API_KEY, HERE, VENV_BIN, Server, free_port, start_server, stop_server


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


@pytest.fixture(scope="session")
def vision_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from engine.testing.tiny import build_tiny

    root = tmp_path_factory.mktemp("vision_server")
    artifact = build_tiny(root / "tiny-vl.ninfer", vision=True)
    port = free_port()
    cmd = [
        str(VENV_BIN / "ninfer-serve"), str(artifact),
        "--port", str(port),
        "--vision",
        "--max-context", "512",
        "--max-media-tokens", "64",
        "--default-max-tokens", "4",
        "--greedy",
        "--log-stats-interval-ms", "0",
    ]  # fmt: skip
    url, process = start_server(cmd, root / "server.log", port)
    yield Server(url, process, root / "server.log")
    stop_server(process)
