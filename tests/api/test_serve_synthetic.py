"""`ninfer-serve --synthetic`: random weights of a geometry built on the device, served with the real Qwen3.5
tokenizer and chat template, and never passing for a real model (/v1/models, /stats, the request log)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
from api_helpers import VENV_BIN, free_port, start_server, stop_server

from api.serve import parse_args


def test_synthetic_tiny_serves_and_says_it_is_synthetic(tmp_path: Path) -> None:
    port = free_port()
    request_log = tmp_path / "requests.jsonl"
    cmd = [
        str(VENV_BIN / "ninfer-serve"), "--synthetic", "tiny-dense",
        "--port", str(port),
        "--max-context", "384",
        "--default-max-tokens", "8",
        "--request-log-jsonl", str(request_log),
        "--log-stats-interval-ms", "0",
    ]  # fmt: skip
    url, process = start_server(cmd, tmp_path / "server.log", port)
    try:
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}
        models = httpx.get(f"{url}/v1/models").json()["data"]
        assert [m["id"] for m in models] == ["tiny-dense-synthetic"]
        assert models[0]["synthetic"] is True and models[0]["synthetic_geometry"] == "tiny-dense"
        load = httpx.get(f"{url}/stats").json()["load"]
        assert load["synthetic"] == "tiny-dense" and load["artifact"] is None
        assert load["model_id"] == "tiny-dense-synthetic"

        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(
            model="tiny-dense-synthetic",
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=6,
            temperature=0,
        )
        assert reply.model == "tiny-dense-synthetic"
        assert reply.usage is not None and reply.usage.completion_tokens >= 1
        # The real chat template wraps the message: far more prompt tokens than the two words.
        assert reply.usage.prompt_tokens > 5
        assert reply.choices[0].finish_reason in ("length", "stop")
    finally:
        stop_server(process)
    events = [json.loads(line) for line in request_log.read_text().splitlines()]
    start = next(e for e in events if e["event"] == "server_start")
    assert start["synthetic"] == "tiny-dense" and start["model_id"] == "tiny-dense-synthetic"
    assert start["artifact"] is None
    assert "RANDOM weights" in (tmp_path / "server.log").read_text()


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["m.ninfer", "--synthetic", "tiny-dense"], "give one, not both"),
        (["--synthetic", "tiny-dense", "--expected-sha256", "0" * 64], "drop --expected-sha256"),
        (["--synthetic", "llama-70b"], "invalid choice"),
        (["--weights-id", "groupwise-int"], "needs --synthetic"),
    ],
)
def test_bad_synthetic_combinations_exit_2(
    argv: list[str], reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [str(tmp_path / a) if a.endswith(".ninfer") else a for a in argv]
    (tmp_path / "m.ninfer").write_bytes(b"x")
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2
    assert reason in capsys.readouterr().err


def test_real_geometry_without_a_gpu_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("api.serve._cuda_available", lambda: False)
    with pytest.raises(SystemExit) as info:
        parse_args(["--synthetic", "qwen3.6-27b"])
    assert info.value.code == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_synthetic_geometries_match_the_bench() -> None:
    from engine.testing.bench import GEOMETRIES as BENCH
    from engine.testing.synthetic import GEOMETRIES, SYNTHETIC_NAMES, synthetic_config

    assert BENCH is GEOMETRIES and set(GEOMETRIES) < set(SYNTHETIC_NAMES)
    assert synthetic_config("qwen3.6-27b").hidden_size == 5120
    assert synthetic_config("tiny-dense").hidden_size == 64
