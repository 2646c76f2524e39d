"""SIGTERM drains: a stream in flight runs to its end, then the server exits."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path

import httpx
from api_helpers import API_KEY, HERE, free_port, start_server


def test_sigterm_lets_the_stream_in_flight_finish(tmp_path: Path) -> None:
    port = free_port()
    cmd = [sys.executable, str(HERE / "scripted_server.py"), "--port", str(port), "--api-key", API_KEY]
    url, process = start_server(cmd, tmp_path / "server.log", port)
    lines: list[str] = []
    started = threading.Event()

    def read() -> None:
        body = {
            "model": "ninfer-tiny-dense",
            "messages": [{"role": "user", "content": "[[long]] go"}],
            "stream": True,
        }
        headers = {"Authorization": f"Bearer {API_KEY}"}
        with httpx.stream(
            "POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=30
        ) as response:
            for line in response.iter_lines():
                if line:
                    lines.append(line)
                started.set()

    reader = threading.Thread(target=read)
    reader.start()
    try:
        assert started.wait(10)
        time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        reader.join(30)
        assert process.wait(timeout=30) == 0  # a clean drain exits 0 (not the re-raised SIGTERM, 143)
    finally:
        if process.poll() is None:
            process.kill()
    assert lines[-1] == "data: [DONE]"
    assert any('"finish_reason": "stop"' in line for line in lines)
