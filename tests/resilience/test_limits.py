"""Server limits against a real server over real sockets: a large prompt is refused by the context without
stalling other requests, the default body limit follows the context, stalled headers and bodies time out
(408), a connection past `--max-connections` gets a clear 503, a client that leaves while queued frees its
pending place at once, and overload refusals carry Retry-After (Anthropic's 529 logged as 529). Then a
SIGTERM drain: `/ready` turns 503 while `/health` stays 200, new requests get 503 with Retry-After, the
stream in flight finishes and the process exits 0; a stalled upload cannot hold the shutdown."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ninfer_proc import MODEL, Server, read_log, serve, stats

FLAGS = ("--max-concurrency", "1", "--max-pending-requests", "1", "--header-timeout-s", "1",
         "--body-timeout-s", "1", "--max-connections", "6", "--pending-timeout-ms", "60000")  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serve(tmp_path_factory.mktemp("limits"), *FLAGS, max_context=512) as server:
        yield server


def _connect(server: Server) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _read_to_close(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def _long_stream(
    server: Server, started: threading.Event, lines: list[str], path: str = "/v1/messages"
) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 400,
        "stream": True,
        "messages": [{"role": "user", "content": "go"}],
    }
    with httpx.stream("POST", server.url + path, json=body, timeout=120) as response:
        for line in response.iter_lines():
            lines.append(line)
            started.set()


def test_a_huge_prompt_is_refused_by_the_context_while_health_stays_fast(server: Server) -> None:
    latencies: list[float] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            t = time.monotonic()
            httpx.get(f"{server.url}/health", timeout=30)
            latencies.append(time.monotonic() - t)
            time.sleep(0.02)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hello " * 600_000}]}  # 3.6 MB
        started = time.monotonic()
        response = httpx.post(f"{server.v1}/chat/completions", json=body, timeout=60)
        seconds = time.monotonic() - started
    finally:
        done.set()
        prober.join()
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
    assert "at least" in response.json()["error"]["message"]  # counted only as far as the context
    assert seconds < 10 and max(latencies) < 2.0, (seconds, max(latencies))
    start = next(r for r in read_log(server) if r["event"] == "server_start")
    assert start["options"]["max_request_mib"] == 4  # from the 512-token context (the 4 MiB floor)
    big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * (5 << 20)}]}
    assert httpx.post(f"{server.v1}/chat/completions", json=big, timeout=60).status_code == 413


def test_stalled_headers_and_bodies_time_out_with_408(server: Server) -> None:
    with _connect(server) as idle:
        started = time.monotonic()
        assert idle.recv(100).startswith(b"HTTP/1.1 408")
        assert idle.recv(100) == b""  # closed
        assert time.monotonic() - started < 5
    with _connect(server) as stalled:
        stalled.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: 100\r\n\r\n{\"model\":")  # fmt: skip
        answer = _read_to_close(stalled)
    assert answer.startswith(b"HTTP/1.1 408")
    body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert body["type"] == "error" and body["error"]["type"] == "timeout_error"


def test_connections_past_the_limit_get_a_clear_503(server: Server) -> None:
    held = [_connect(server) for _ in range(6)]
    try:
        response = httpx.get(f"{server.v1}/models", timeout=10)
    finally:
        for sock in held:
            sock.close()
    assert response.status_code == 503 and response.headers["retry-after"]
    assert response.json()["error"]["code"] == "too_many_connections"
    time.sleep(0.3)
    assert httpx.get(f"{server.v1}/models", timeout=10).status_code == 200


def _wait_for(server: Server, key: str, value: int, timeout: float = 20.0) -> float:
    started = time.monotonic()
    while stats(server)["engine"][key] != value:
        assert time.monotonic() - started < timeout, f"{key} never became {value}: {stats(server)}"
        time.sleep(0.02)
    return time.monotonic() - started


def _post_raw(sock: socket.socket, path: str, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)  # fmt: skip


def test_a_client_leaving_the_queue_frees_its_place_and_overload_says_retry_after(server: Server) -> None:
    started, lines = threading.Event(), []
    runner = threading.Thread(target=_long_stream, args=(server, started, lines))
    runner.start()
    try:
        assert started.wait(30)
        ghost = _connect(server)
        _post_raw(ghost, "/v1/chat/completions", {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "q"}]})  # fmt: skip
        _wait_for(server, "num_waiting", 1)
        body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "full"}]}
        over = httpx.post(f"{server.v1}/messages", json=body, timeout=30)  # the one pending place is taken
        over_openai = httpx.post(f"{server.v1}/chat/completions", json=body, timeout=30)
        ghost.close()
        freed_after = _wait_for(server, "num_waiting", 0)
        assert runner.is_alive()  # freed while the lane is still busy: not when admitted
    finally:
        runner.join(120)
    assert freed_after < 3.0
    assert over.status_code == 529 and over.headers["retry-after"], over.text
    assert over_openai.status_code == 429 and over_openai.headers["retry-after"]
    records = read_log(server)
    refused = [
        r for r in records if r["event"] == "request_rejected" and r.get("protocol") == "anthropic.messages"
    ]
    assert refused and refused[-1]["status"] == 529
    assert any(r["event"] == "request_rejected" and r.get("code") == "client_disconnected" for r in records)


def test_sigterm_drains_readiness_first_then_exits_0(tmp_path: Path) -> None:
    with serve(tmp_path / "drain", "--shutdown-timeout-s", "60", env={"NINFER_API_KEY": "k3y"}) as server:
        assert httpx.get(f"{server.url}/ready", timeout=10).json() == {"status": "ready"}
        assert httpx.get(f"{server.v1}/models", timeout=10).status_code == 401  # the key from the env
        started, lines = threading.Event(), []
        runner = threading.Thread(target=_stream_with_key, args=(server, started, lines))
        runner.start()
        assert started.wait(30)
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        ready = httpx.get(f"{server.url}/ready", timeout=10)
        health = httpx.get(f"{server.url}/health", timeout=10)
        refused = httpx.get(f"{server.v1}/models", headers={"x-api-key": "k3y"}, timeout=10)
        runner.join(120)
        assert server.process.wait(timeout=60) == 0
    assert ready.status_code == 503 and ready.json()["status"] == "draining"
    assert health.status_code == 200
    assert refused.status_code == 503 and refused.headers["retry-after"]
    assert lines[-1] == "data: [DONE]"


def _stream_with_key(server: Server, started: threading.Event, lines: list[str]) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 200,
        "stream": True,
        "messages": [{"role": "user", "content": "go"}],
    }
    headers = {"Authorization": "Bearer k3y"}
    with httpx.stream("POST", f"{server.v1}/chat/completions", json=body, headers=headers, timeout=120) as r:
        for line in r.iter_lines():
            if line:
                lines.append(line)
                started.set()


def test_a_stalled_upload_cannot_hold_the_shutdown(tmp_path: Path) -> None:
    flags = ("--shutdown-timeout-s", "2", "--body-timeout-s", "300")
    with serve(tmp_path / "stalled", *flags) as server:
        with _connect(server) as stalled:
            stalled.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{")
            time.sleep(0.3)
            started = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            server.process.wait(timeout=30)
            assert time.monotonic() - started < 10
