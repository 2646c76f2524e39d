"""The JSONL request log: events written by a real server (never text), and lossless size rotation."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from api_helpers import Server

from api.request_log import RequestLog
from monitor.metrics import APIS


def test_rotation_loses_no_line_and_keeps_n_files(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    log = RequestLog(path, max_bytes=4096, keep=3)
    num_threads, per_thread = 4, 150

    def writer(t: int) -> None:
        for i in range(per_thread):
            log.write("request_done", request_id=f"{t}-{i}", padding="x" * 40)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(num_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    log.close()
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == [
        "requests.jsonl",
        "requests.jsonl.1",
        "requests.jsonl.2",
        "requests.jsonl.3",
    ]
    # Nothing beyond keep survives, so count what the kept files hold and check they are whole, unique lines
    # forming the newest contiguous tail of the writes.
    records = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    ids = [r["request_id"] for r in records]
    assert len(ids) == len(set(ids))
    assert all(f.stat().st_size <= 4096 + 200 for f in files)

    # Without a cap on kept files being hit, every line survives a rotation.
    path2 = tmp_path / "all" / "requests.jsonl"
    path2.parent.mkdir()
    log2 = RequestLog(path2, max_bytes=2048, keep=1000)
    for i in range(500):
        log2.write("request_done", request_id=i)
    log2.close()
    lines = [json.loads(line) for f in path2.parent.iterdir() for line in f.read_text().splitlines()]
    assert sorted(r["request_id"] for r in lines) == list(range(500))
    assert len(list(path2.parent.iterdir())) > 3


def test_real_server_logs_request_events_without_text(real_server: Server) -> None:
    client = openai.OpenAI(base_url=real_server.v1, api_key="unused", max_retries=0)
    secret = "zebra-quokka-marmalade"
    client.chat.completions.create(
        model="tiny-alias", messages=[{"role": "user", "content": secret}], max_tokens=2
    )
    try:
        client.chat.completions.create(
            model="tiny-alias", messages=[{"role": "user", "content": "w " * 600}], max_tokens=2
        )
    except openai.BadRequestError:
        pass
    time.sleep(1.2)  # one throughput interval (500 ms)
    assert real_server.request_log is not None
    text = real_server.request_log.read_text()
    assert secret not in text
    records = [json.loads(line) for line in text.splitlines()]
    events = {r["event"] for r in records}
    assert {"server_start", "request_start", "request_done", "request_rejected", "throughput"} <= events
    assert all(
        r["artifact_type"] == "ninfer_serve_request_log" and "server_instance_id" in r for r in records
    )
    start = next(r for r in records if r["event"] == "server_start")
    scheduler = start["engine_config"]["scheduler"]  # the effective value, not the unset default (None)
    assert (scheduler["prefill_chunk"], scheduler["prefill_chunk_decoding"]) == (1024, 1024)
    ticks = [r for r in records if r["event"] == "throughput"]
    # Engine progress, not request completions: the prefilled tokens appear in the intervals that ran them.
    prefilled = sum(t["prefill_tokens_per_second"] * t["interval_seconds"] for t in ticks)
    assert prefilled >= 1 and prefilled == pytest.approx(ticks[-1]["engine"]["num_prefill_tokens"], abs=0.5)
    done = [r for r in records if r["event"] == "request_done"][-1]
    assert done["result"]["finish_reason"] == "length" and done["result"]["completion_tokens"] == 2
    assert set(done["timings_seconds"]) >= {"ttft", "decode", "total"}
    rejected = [r for r in records if r["event"] == "request_rejected"][-1]
    assert rejected["status"] == 400 and rejected["code"] == "context_length_exceeded"


def test_metrics_label_each_api_by_its_declared_name(real_server: Server) -> None:
    """Responses and Anthropic requests count under api="openai_responses" / api="anthropic" (the names
    monitor.metrics declares and the dashboards filter on), not under the request log's protocol string."""
    openai.OpenAI(base_url=real_server.v1, api_key="unused", max_retries=0).responses.create(
        model="tiny-alias", input="hi", max_output_tokens=1
    )
    anthropic.Anthropic(base_url=real_server.url, api_key="unused", max_retries=0).messages.create(
        model="tiny-alias", max_tokens=1, messages=[{"role": "user", "content": "hi"}]
    )
    text = httpx.get(f"{real_server.url}/metrics").text
    labels = set(re.findall(r'^ninfer_requests_total\{api="([^"]*)"', text, re.MULTILINE))
    assert labels <= set(APIS), labels
    for api in ("openai_responses", "anthropic"):
        assert re.search(rf'^ninfer_requests_total\{{api="{api}",finish_reason="length"}} [1-9]', text, re.M)
