"""`ninfer-serve --spec mtp --draft-tokens 3` on the demo model: a real server answers, and its rounds,
drafts and acceptance show on /stats, in the request log's `speculative` block and as the
`ninfer_spec_decode_*` metrics the MTP dashboard queries."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
from api_helpers import VENV_BIN, free_port, start_server, stop_server


def _metric(text: str, name: str, labels: str = "") -> float:
    match = re.search(rf"^{name}{re.escape(labels)} ([0-9.e+-]+)$", text, re.MULTILINE)
    assert match is not None, f"{name}{labels} not exported"
    return float(match.group(1))


def test_mtp_speculation_through_a_real_server(tmp_path: Path) -> None:
    port = free_port()
    request_log = tmp_path / "requests.jsonl"
    cmd = [
        str(VENV_BIN / "ninfer-serve"),
        "--port", str(port),
        "--max-context", "256",
        "--spec", "mtp",
        "--draft-tokens", "3",
        "--greedy",
        "--no-thinking",
        "--request-log-jsonl", str(request_log),
        "--log-stats-interval-ms", "0",
        "--model-id", "m",
    ]  # fmt: skip
    url, process = start_server(cmd, tmp_path / "server.log", port)
    try:
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "Tell me about cats."}],
            "max_tokens": 12,
        }
        with httpx.Client(base_url=url, timeout=120) as client:
            answer = client.post("/v1/chat/completions", json=body)
            engine = client.get("/stats").json()["engine"]
            metrics = client.get("/metrics").text
    finally:
        stop_server(process)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == 12
    assert engine["spec_method"] == "mtp" and engine["spec_draft_tokens"] == 3
    assert engine["spec_rounds"] > 0 and engine["spec_drafted_tokens"] >= engine["spec_rounds"]
    records = [json.loads(line) for line in request_log.read_text().splitlines()]
    done = [r for r in records if r.get("event") == "request_done"]
    spec = done[0]["speculative"]
    assert spec["backend"] == "mtp" and spec["draft_window"] == 3
    assert spec["rounds"] == engine["spec_rounds"] and spec["drafted_tokens"] == engine["spec_drafted_tokens"]
    assert len(spec["accepted_per_position"]) == 3
    assert _metric(metrics, "ninfer_spec_decode_drafts_total") == spec["rounds"]
    assert _metric(metrics, "ninfer_spec_decode_draft_tokens_total") == spec["drafted_tokens"]
