"""Faults against a real server: streams cut at random points, SIGTERM under load, a deep queue at one
lane. Each ends with the engine healthy and the request log accounting for every request."""

from __future__ import annotations

import json
import random
import signal
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from ninfer_proc import MODEL, Server, assert_healthy, assert_log_accounts, read_log, serve

OPENAI = "/v1/chat/completions"
ANTHROPIC = "/v1/messages"


def _body(path: str, text: str, max_tokens: int, stream: bool = True) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": max_tokens,
        "stream": stream,
        "messages": [{"role": "user", "content": text}],
    }


def _raw(url: str, path: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {urlsplit(url).netloc}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + data


def _cut_once(server: Server, index: int, seed: int) -> str:
    """Send one streamed request and drop the connection at a random point; return where."""
    rng = random.Random(seed)
    path = OPENAI if index % 2 else ANTHROPIC
    data = _raw(server.url, path, _body(path, f"Tell story number {index}.", 8))
    parts = urlsplit(server.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=60) as sock:
        if rng.random() < 0.5:  # half end in a reset rather than an orderly close
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        where = rng.random()
        if where < 0.15:
            sock.sendall(data[: rng.randrange(len(data) - 40, len(data))])  # inside the body
            return "request"
        sock.sendall(data)
        if where < 0.25:
            return "before_response"
        want, got = rng.randrange(1, 2000), 0
        while got < want:
            chunk = sock.recv(min(4096, want - got))
            if not chunk:
                return "complete"
            got += len(chunk)
        return "stream"


def test_fifty_streams_cut_at_random_points(tmp_path: Path) -> None:
    with serve(tmp_path, "--max-concurrency", "2", "--max-pending-requests", "64") as server:
        with ThreadPoolExecutor(max_workers=8) as pool:
            cuts = list(pool.map(lambda i: _cut_once(server, i, 1000 + i), range(50)))
        assert {"request", "stream"} <= set(cuts), cuts
        assert_healthy(server)
        # Every request whose headers arrived reached the gate and has exactly one ending.
        ends = assert_log_accounts(server, min_requests=sum(1 for c in cuts if c != "request") + 1)
        reasons = {(r.get("result") or {}).get("finish_reason") or r.get("code") for r in ends}
        assert "client_disconnected" in reasons, reasons
        assert "unhandled error" not in server.log.read_text()  # a cut is not a server error
        # The server still serves a complete stream afterwards.
        response = httpx.post(f"{server.v1}/chat/completions", json=_body(OPENAI, "hi", 3, stream=False))
        assert response.status_code == 200 and response.json()["choices"][0]["finish_reason"] == "length"


def _stream_lines(url: str, body: dict[str, Any], lines: list[str], started: threading.Event) -> None:
    with httpx.stream("POST", f"{url}{OPENAI}", json=body, timeout=120) as response:
        for line in response.iter_lines():
            if line:
                lines.append(line)
                started.set()


def test_sigterm_under_load_drains(tmp_path: Path) -> None:
    """In-flight and queued streams complete; new requests get 503; the log is whole and accounts."""
    with serve(tmp_path, "--max-concurrency", "2", "--max-pending-requests", "8") as server:
        streams: list[tuple[list[str], threading.Event, threading.Thread]] = []
        for i in range(4):
            lines: list[str] = []
            started = threading.Event()
            body = _body(OPENAI, f"Count to {i}.", 24)
            thread = threading.Thread(target=_stream_lines, args=(server.url, body, lines, started))
            thread.start()
            streams.append((lines, started, thread))
        assert streams[0][1].wait(60) and streams[1][1].wait(60)
        server.process.send_signal(signal.SIGTERM)
        refused: list[int | str] = []
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            try:
                response = httpx.post(
                    f"{server.v1}/chat/completions", json=_body(OPENAI, "new", 2), timeout=10
                )
                refused.append(response.status_code)
                if response.status_code == 503:
                    assert response.json()["error"]["code"] == "server_shutting_down"
            except httpx.ConnectError:
                refused.append("refused")
            time.sleep(0.05)
        for _, _, thread in streams:
            thread.join(120)
        assert server.process.wait(timeout=60) in (0, -signal.SIGTERM)
        assert refused and set(refused) <= {503, "refused"}, refused
        assert 503 in refused, refused
        for lines, _, _ in streams:
            assert lines[-1] == "data: [DONE]", lines[-3:]
            assert any('"finish_reason":"length"' in line.replace(" ", "") for line in lines), lines[-3:]
        text = server.request_log.read_text()
        assert text.endswith("\n")
        records = read_log(server)  # every line parses
        ends = assert_log_accounts(server, min_requests=4 + refused.count(503))
        done = [r for r in ends if r["event"] == "request_done"]
        assert sum(1 for r in done if r["result"]["finish_reason"] == "length") >= 4
        assert sum(1 for r in ends if r.get("code") == "server_shutting_down") == refused.count(503)
        assert records[0]["event"] == "server_start"


def test_hundred_queued_requests_at_one_lane(tmp_path: Path) -> None:
    flags = ("--max-concurrency", "1", "--max-pending-requests", "100", "--pending-timeout-ms", "300000")
    with serve(tmp_path, *flags) as server:

        def one(i: int) -> tuple[int, str | None]:
            stream = i % 3 == 0
            path = ANTHROPIC if i % 2 else OPENAI
            body = _body(path, f"q{i}", 1, stream=stream)
            response = httpx.post(f"{server.url}{path}", json=body, timeout=300)
            if response.status_code != 200:
                return response.status_code, response.text[:200]
            if stream:
                return 200, "[DONE]" if path == OPENAI and "[DONE]" in response.text else (
                    "message_stop" if "message_stop" in response.text else response.text[-200:])  # fmt: skip
            payload = response.json()
            return 200, payload.get("stop_reason") or payload["choices"][0]["finish_reason"]

        with ThreadPoolExecutor(max_workers=100) as pool:
            results = list(pool.map(one, range(100)))
        bad = [
            r
            for r in results
            if r[0] != 200
            or r[1] not in ("length", "max_tokens", "stop", "end_turn", "[DONE]", "message_stop")
        ]
        assert not bad, bad[:5]
        snap = httpx.get(f"{server.url}/stats").json()
        assert snap["http"]["max_in_flight"] <= 100 and snap["engine"]["max_concurrency"] == 1
        assert_healthy(server)
        ends = assert_log_accounts(server, min_requests=100)
        assert sum(1 for r in ends if r["event"] == "request_done") >= 100
