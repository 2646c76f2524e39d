"""Clients that vanish mid-stream: the real engine ends up with no running request and no leaked pages."""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
from conftest import Server

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
