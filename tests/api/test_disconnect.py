"""Clients that vanish mid-stream: the real engine ends up with no running request and no leaked pages."""

from __future__ import annotations

import json
import random
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import openai
import pytest
from api_helpers import Server

PROMPT = [{"role": "system", "content": "Disconnect test."}, {"role": "user", "content": "Talk for a while."}]


def _engine_stats(server: Server) -> dict[str, int]:
    return httpx.get(f"{server.url}/stats").json()["engine"]


def _cut(server: Server, seed: int) -> None:
    rng = random.Random(seed)
    client = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)
    stream = client.chat.completions.create(model="tiny-alias", messages=PROMPT, max_tokens=64, stream=True)
    for read, _chunk in enumerate(stream):
        if read >= rng.randrange(0, 8):
            break
    stream.close()


def test_fifty_cut_streams_leave_no_running_request_and_no_pages(real_server: Server) -> None:
    client = openai.OpenAI(base_url=real_server.v1, api_key="unused", max_retries=0)
    client.chat.completions.create(
        model="tiny-alias", messages=PROMPT, max_tokens=2
    )  # checkpoints this prompt
    assert _engine_stats(real_server)["num_running"] == 0
    baseline = _engine_stats(real_server)["num_pages_used"]
    with ThreadPoolExecutor(max_workers=5) as pool:
        list(pool.map(lambda seed: _cut(real_server, seed), range(50)))
    deadline = time.monotonic() + 30
    stats = _engine_stats(real_server)
    while time.monotonic() < deadline and (stats["num_running"] or stats["num_waiting"]):
        time.sleep(0.1)
        stats = _engine_stats(real_server)
    assert stats["num_running"] == 0 and stats["num_waiting"] == 0
    # Pages still in use belong to prefix checkpoints (bounded, LRU-evicted); a leaked request would add its own.
    assert stats["num_pages_used"] <= baseline
    assert stats["num_requests_finished"].get("aborted", 0) > 0
    http = httpx.get(f"{real_server.url}/stats").json()["http"]
    assert http["in_flight"] == 0


def _wait_engine(server: Server, running: int, timeout: float) -> float:
    """Seconds until /stats shows `running` requests running (fails after `timeout`)."""
    start = time.monotonic()
    while _engine_stats(server)["num_running"] != running:
        assert time.monotonic() - start < timeout, f"num_running never reached {running}"
        time.sleep(0.01)
    return time.monotonic() - start


def test_a_dropped_non_streamed_request_is_aborted_at_once(real_server: Server) -> None:
    """A non-streamed request whose client goes away stops in the engine, not at max_tokens."""
    _wait_engine(real_server, 0, 30)
    body = json.dumps(
        {"model": "tiny-alias", "messages": PROMPT, "max_tokens": 300, "temperature": 0, "stream": False}
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    host, port = real_server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(head + body)
    _wait_engine(real_server, 1, 10)
    sock.close()
    assert _wait_engine(real_server, 0, 5) < 2.0
    deadline = time.monotonic() + 5
    while True:
        done = [
            r
            for r in map(json.loads, real_server.request_log.read_text().splitlines())  # type: ignore[union-attr]
            if r["event"] == "request_done" and r.get("protocol") == "chat.completions"
        ]
        if done and done[-1]["result"]["finish_reason"] == "client_disconnected":
            break
        assert time.monotonic() < deadline, f"no client_disconnected ending: {done[-1:]}"
        time.sleep(0.05)
    assert done[-1]["result"]["completion_tokens"] < 300
    assert httpx.get(f"{real_server.url}/stats").json()["http"]["in_flight"] == 0


def test_an_sdk_timeout_on_a_non_streamed_message_aborts_it(real_server: Server) -> None:
    """The Anthropic SDK giving up (its read timeout) frees the lane too, and the log says why."""
    _wait_engine(real_server, 0, 30)
    client = anthropic.Anthropic(base_url=real_server.url, api_key="unused", max_retries=0, timeout=1.5)
    with pytest.raises(anthropic.APITimeoutError):
        client.messages.create(
            model="tiny-alias",
            max_tokens=300,
            messages=[{"role": "user", "content": "Go on."}],
        )
    assert _wait_engine(real_server, 0, 5) < 2.0
    assert real_server.request_log is not None
    deadline = time.monotonic() + 5
    while True:
        records = map(json.loads, real_server.request_log.read_text().splitlines())
        done = [
            r for r in records if r["event"] == "request_done" and r.get("protocol") == "anthropic.messages"
        ]
        if done and done[-1]["result"]["finish_reason"] == "client_disconnected":
            break
        assert time.monotonic() < deadline, f"no client_disconnected ending: {done[-1:]}"
        time.sleep(0.05)
    assert done[-1]["result"]["completion_tokens"] < 300
