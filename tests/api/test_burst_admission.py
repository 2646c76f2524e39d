"""Burst admission through real HTTP: `ninfer-serve` on the demo model (uvicorn, the real engine) driven by the
official openai SDK. Eight streamed chat requests sent at once share ONE prefill step (the `/stats` deltas) and
each streams exactly what it streams alone (greedy); a request refused after its announcement (validation, a
prompt too long) leaves no hold behind; `--burst-wait-ms 0` never holds and changes no output."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
from api_helpers import VENV_BIN, Server, free_port, start_server, stop_server

BURST = 8
MODEL = "ninfer-tiny-dense"  # the demo model's id


def _serve(root: Path, *flags: str) -> Server:
    port = free_port()
    cmd = [
        str(VENV_BIN / "ninfer-serve"),
        "--port", str(port),
        "--max-context", "256",
        "--max-concurrency", str(BURST),
        "--kv-capacity", str(BURST * 256),  # pages for every lane at once
        "--no-prefix-reuse",  # every request prefills cold: alone and in the burst alike
        "--greedy",
        "--no-thinking",
        "--log-stats-interval-ms", "0",
        *flags,
    ]  # fmt: skip
    url, process = start_server(cmd, root / "server.log", port)
    return Server(url, process, root / "server.log")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # a long hold: a slow machine still gathers the burst, and a leaked announcement would show as seconds
    started = _serve(tmp_path_factory.mktemp("burst"), "--burst-wait-ms", "1000")
    yield started
    stop_server(started.process)


def engine_stats(server: Server) -> dict[str, int]:
    with urllib.request.urlopen(f"{server.url}/stats", timeout=10) as response:
        engine: dict[str, int] = json.load(response)["engine"]
    return engine


def delta(before: dict[str, int], after: dict[str, int], *keys: str) -> dict[str, int]:
    return {k: after[k] - before[k] for k in keys}


QUESTIONS = [
    f"Question {k}: name {'a colour' if k % 2 else 'an animal'} and a number{'!' * k}" for k in range(BURST)
]


async def stream_text(client: openai.AsyncOpenAI, question: str) -> str:
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": question}],
        max_tokens=6,
        stream=True,
    )
    parts = []
    async for chunk in stream:
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
    return "".join(parts)


class Together(httpx.AsyncHTTPTransport):
    """Sends each request's head and first body byte, and the rest only once the server has announced all `n` of
    a round to its engine (`/stats` `num_announced`): the requests then certainly arrive together, which on a
    shared 2-core machine the client's own tasks would not guarantee (they spread the sends over milliseconds)."""

    def __init__(self, n: int, stats_url: str | None) -> None:  # None: release once the client has all n
        super().__init__()
        self.n, self.stats_url, self.ready, self.go = n, stats_url, 0, asyncio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request.stream = _Held(request.read(), self._gate)  # Content-Length stays: the body just comes in two
        return await super().handle_async_request(request)

    async def _gate(self) -> None:
        go = self.go
        self.ready += 1
        if self.ready == self.n:  # the last of the round: wait for the server to know them all, then release
            self.ready, self.go = 0, asyncio.Event()
            if self.stats_url is not None:
                await self._announced()
            go.set()
        await go.wait()

    async def _announced(self) -> None:
        assert self.stats_url is not None
        async with httpx.AsyncClient(timeout=10) as http:
            for _ in range(3000):
                if (await http.get(self.stats_url)).json()["engine"]["num_announced"] >= self.n:
                    return
                await asyncio.sleep(0.01)
        raise AssertionError(f"the server never announced {self.n} requests")


class _Held(httpx.AsyncByteStream):
    def __init__(self, body: bytes, gate: Callable[[], Awaitable[None]]) -> None:
        self.body, self.gate = body, gate

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.body[:1]
        await self.gate()
        yield self.body[1:]


async def burst(server: Server, questions: list[str], *, announced: bool = True) -> list[str]:
    """The requests sent together, twice (the first round opens the pooled connections); the second's texts.
    `announced`: each round's bodies complete once the server has announced them all (else at once)."""
    stats_url = f"{server.url}/stats" if announced else None
    http = httpx.AsyncClient(transport=Together(len(questions), stats_url), timeout=120)
    async with openai.AsyncOpenAI(
        base_url=server.v1, api_key="none", max_retries=0, http_client=http
    ) as client:
        await asyncio.gather(*(stream_text(client, q) for q in questions))
        return list(await asyncio.gather(*(stream_text(client, q) for q in questions)))


async def one_by_one(server: Server, questions: list[str]) -> list[str]:
    async with openai.AsyncOpenAI(base_url=server.v1, api_key="none", max_retries=0, timeout=120) as client:
        return [await stream_text(client, q) for q in questions]


def test_eight_streamed_requests_sent_together_share_one_prefill_step(server: Server) -> None:
    alone = asyncio.run(one_by_one(server, QUESTIONS))
    keys = ("num_prefill_steps", "num_mixed_steps", "num_requests_added", "num_burst_timeouts")
    for _ in range(3):
        before = engine_stats(server)
        together = asyncio.run(burst(server, QUESTIONS))
        after = engine_stats(server)
        assert together == alone  # greedy: batching changes no output
        counts = delta(before, after, *keys)
        if counts["num_burst_timeouts"] == 0:
            break  # else the machine stalled a request past the 1 s hold (a shared CI box): the round again
    # the connection-opening round and the measured round: one prefill step each, none beside a decoding lane
    expected = {"num_prefill_steps": 2, "num_mixed_steps": 0, "num_requests_added": 2 * BURST}
    assert counts == {**expected, "num_burst_timeouts": 0}, counts
    assert after["burst_wait_ms"] == 1000


def test_a_request_refused_after_its_announcement_leaves_no_hold(server: Server) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key="none", max_retries=0, timeout=60)
    before = engine_stats(server)
    with pytest.raises(openai.BadRequestError):  # announced on arrival, refused by validation
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=-3
        )
    with pytest.raises(openai.BadRequestError):  # refused after templating: the prompt does not fit
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "word " * 400}])
    text = asyncio.run(one_by_one(server, QUESTIONS[:1]))
    after = engine_stats(server)
    assert text == asyncio.run(one_by_one(server, QUESTIONS[:1]))
    # the lone request found no announcement left to wait for: no hold (a leaked one would have held it 1 s)
    assert delta(before, after, "num_burst_holds", "num_requests_added") == {
        "num_burst_holds": 0,
        "num_requests_added": 1,
    }


def test_every_generation_route_consumes_or_withdraws_its_announcement(server: Server) -> None:
    before = engine_stats(server)
    bodies = {
        "/v1/messages": {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]},
        "/v1/responses": {"model": MODEL, "max_output_tokens": 3, "input": "hi"},
        "/v1/chat/completions": {"model": MODEL, "max_tokens": 3, "messages": []},  # refused: no messages
    }
    status = {
        path: httpx.post(server.url + path, json=body, timeout=60).status_code
        for path, body in bodies.items()
    }
    assert status == {"/v1/messages": 200, "/v1/responses": 200, "/v1/chat/completions": 400}
    after = engine_stats(server)
    assert after["num_announced"] == 0  # none left behind to hold a later burst
    assert delta(before, after, "num_burst_holds", "num_requests_added") == {
        "num_burst_holds": 0,
        "num_requests_added": 2,
    }


def test_burst_wait_zero_never_holds_and_changes_no_output(
    server: Server, tmp_path_factory: pytest.TempPathFactory
) -> None:
    alone = asyncio.run(one_by_one(server, QUESTIONS))
    off = _serve(tmp_path_factory.mktemp("burst_off"), "--burst-wait-ms", "0")
    try:
        together = asyncio.run(burst(off, QUESTIONS, announced=False))
        stats = engine_stats(off)
    finally:
        stop_server(off.process)
    assert together == alone
    assert stats["burst_wait_ms"] == 0 and stats["num_burst_holds"] == 0
    assert stats["num_prefill_steps"] >= 2  # at least one per round
