"""`ninfer-serve --host-kv-cache-mib`: a real server on the demo model parks a session that a side
request evicts, restores it when the conversation comes back, and shows it on /stats, /metrics and in
the request log (`host_cache_hit_tokens`, `prefix_reuse_path: host_restore`). `--spec dflash` is refused
at startup with the reason (with host parking first: its draft caches are not parked); `--spec mtp` parks.

The server runs with overlap scheduling (`--overlap`, off by default on the CPU), so the official openai SDK's
streams are compared there too: a request with logprobs takes the synchronous step (its tokens are needed on
the host before the next step), so the same prompt with and without them compares overlap with no overlap."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from api_helpers import VENV_BIN, free_port, start_server, stop_server

from api.serve import parse_args


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.MULTILINE)
    assert match is not None, f"{name} not exported"
    return float(match.group(1))


def test_host_parking_through_a_real_server(tmp_path: Path) -> None:
    port = free_port()
    request_log = tmp_path / "requests.jsonl"
    cmd = [
        str(VENV_BIN / "ninfer-serve"),
        "--port", str(port),
        "--max-context", "256",  # one max-context of pages: the side request needs all of them
        "--max-concurrency", "1",
        "--host-kv-cache-mib", "16",
        "--greedy",
        "--no-thinking",
        "--request-log-jsonl", str(request_log),
        "--log-stats-interval-ms", "0",
        "--model-id", "m",
        "--overlap",
    ]  # fmt: skip
    url, process = start_server(cmd, tmp_path / "server.log", port)
    try:
        cats = [{"role": "user", "content": "Tell me about cats."}]
        session = {"model": "m", "messages": cats, "max_tokens": 8}
        side = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 225}
        with httpx.Client(base_url=url, timeout=120) as client:
            first = client.post("/v1/chat/completions", json=session).json()
            assert client.post("/v1/chat/completions", json=side).status_code == 200
            again = client.post("/v1/chat/completions", json=session).json()
            assert again["choices"][0]["message"] == first["choices"][0]["message"]  # greedy, same tokens
            _overlapped_streams_match_the_synchronous_step(url)
            engine = client.get("/stats").json()["engine"]
            metrics = client.get("/metrics").text
    finally:
        stop_server(process)
    assert engine["host_kv_capacity_bytes"] == 16 << 20
    assert engine["host_kv_parks"] >= 1 and engine["host_kv_restores"] == 1
    assert engine["host_kv_restore_bytes"] > 0 and engine["host_kv_used_bytes"] >= 0
    assert _metric(metrics, "ninfer_host_kv_cache_capacity_bytes") == 16 << 20
    assert _metric(metrics, "ninfer_host_kv_park_bytes_total") == engine["host_kv_park_bytes"]
    assert _metric(metrics, "ninfer_host_kv_restore_bytes_total") == engine["host_kv_restore_bytes"]
    records = [json.loads(line) for line in request_log.read_text().splitlines()]
    done = [r["result"] for r in records if r.get("event") == "request_done"]
    assert len(done) == 3 + 5  # and the streams of _overlapped_streams_match_the_synchronous_step
    assert engine["overlap"] is True and engine["num_preemptions"] == 0
    assert done[0]["prefix_reuse_path"] == "none" and done[0]["host_cache_hit_tokens"] == 0
    assert done[2]["prefix_reuse_path"] == "host_restore"
    assert 0 < done[2]["host_cache_hit_tokens"] == done[2]["prefix_cache_hit_tokens"]
    assert 'path="host_restore"' in metrics


def _stream(client: openai.OpenAI, **kwargs: Any) -> tuple[str, str | None, int]:
    """(content, finish reason, completion tokens) of one streamed chat completion."""
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "Tell me about the sea and the ships."}],
            stream=True,
            stream_options={"include_usage": True},
            **kwargs,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = next(
        (c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason), None
    )
    return text, finish, chunks[-1].usage.completion_tokens


def _overlapped_streams_match_the_synchronous_step(url: str) -> None:
    """Five streamed requests: plain (overlapped) and with logprobs (synchronous), then both cut by a stop string."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    overlapped = _stream(client, max_tokens=12)
    synchronous = _stream(client, max_tokens=12, logprobs=True, top_logprobs=1)
    assert overlapped == synchronous and overlapped[1] == "length" and overlapped[2] == 12
    text = overlapped[0]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    cut = _stream(client, max_tokens=12, stop=[stop])
    assert cut == _stream(client, max_tokens=12, stop=[stop], logprobs=True, top_logprobs=1)
    assert cut[1] == "stop" and stop not in cut[0] and text.startswith(cut[0])
    short = _stream(client, max_tokens=3)  # max_tokens ends an overlapped stream where it must
    assert short[1] == "length" and short[2] == 3 and text.startswith(short[0])


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (
            ["--spec", "dflash", "--host-kv-cache-mib", "64"],
            "spec='dflash': cannot run with host_kv_cache_mib=64: host parking does not capture DFlash draft",
        ),
        (["--spec", "dflash"], "spec='dflash': DFlash is not available in this build"),
        (["--spec", "mtp", "--draft-tokens", "0"], "draft_tokens=0: must be in 1..5 with --spec mtp"),
    ],
)
def test_spec_flag_is_refused_with_the_reason(argv: list[str], reason: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert reason in capsys.readouterr().err
