"""`ninfer-bench --server` on the CPU: the tiny geometry's engine step in process, then a real `ninfer-serve
--synthetic tiny-dense` subprocess driven by the official openai SDK; the JSON rows are complete and sane
(exact token counts through the `ignore_eos` extension, positive times, the loss computed from them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.testing.bench.cli import main
from engine.testing.bench.server import RequestTiming, summarize

PROMPT, OUTPUT = 24, 5


def test_server_bench_reports_engine_step_client_tpot_and_loss_per_concurrency(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "server.json"
    argv = [
        "--synthetic", "tiny-dense", "--server", "--concurrency", "1,2",
        "--server-prompt-len", str(PROMPT), "--server-max-tokens", str(OUTPUT),
        "--decode-tokens", "2", "--decode-warmup", "1", "--no-cuda-graph",
        "--server-args=--no-warmup", "--server-log", str(tmp_path / "serve.log"), "--json", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["geometry"] == "tiny-dense" and result["kv_dtype"] == "bf16"
    setup = result["server_setup"]
    assert setup["prompt_tokens"] == PROMPT and setup["max_tokens"] == OUTPUT
    assert "--synthetic" in setup["server_command"] and "--no-warmup" in setup["server_command"]
    rows = result["server"]
    assert [r["concurrency"] for r in rows] == [1, 2]
    for row in rows:
        assert row["prompt_tokens"] == [PROMPT] and row["completion_tokens"] == [OUTPUT]
        assert row["finish_reasons"] == ["length"]
        for key in ("engine_step_ms", "client_tpot_ms_mean", "client_tpot_ms_p50", "ttft_ms_mean",
                    "ttft_ms_p50", "client_tok_s", "wall_s", "tokens_per_chunk"):  # fmt: skip
            assert row[key] > 0, (key, row)
        expected = 100 * (row["client_tpot_ms_mean"] / row["engine_step_ms"] - 1)
        assert row["loss_pct"] == pytest.approx(expected, abs=0.1)
        assert "client_tpot_ms_steady" in row and "loss_pct_steady" in row
        # the server's step counters over the round (a lone short prompt: one prefill step, nothing beside it)
        assert 1 <= row["prefill_steps"] <= row["concurrency"] and row["burst_holds"] in (0, 1)
        if row["concurrency"] == 1:
            assert (row["prefill_steps"], row["mixed_steps"], row["burst_holds"]) == (1, 0, 0)
        # every output token after the first arrived in some chunk: the round cannot be shorter than them
        assert row["wall_s"] * 1e3 >= row["ttft_ms_mean"] + (OUTPUT - 1) * row["client_tpot_ms_mean"] * 0.99
    assert "| C | engine step ms |" in capsys.readouterr().out


def test_summary_weights_tpot_by_tokens_and_times_the_steady_window() -> None:
    # request a: first text at 0.1 s, then 4 chunks 0.01 s apart for 4 tokens; request b: 2 chunks for 4
    # tokens (a held-back token), 0.03 s apart -> TPOT mean = (0.04 + 0.06) / 8 tokens.
    a = RequestTiming(0.1, (0.11, 0.12, 0.13, 0.14), 30, 5, "length", sent_s=100.0)
    b = RequestTiming(0.2, (0.23, 0.26), 30, 5, "length", sent_s=100.0)
    row = summarize([a, b], wall_s=0.5, engine_step_ms=10.0)
    # steady window [100.2, 100.14]... is empty: a finished before b's first token
    assert row["client_tpot_ms_steady"] is None and row["loss_pct_steady"] is None
    c = RequestTiming(0.1, (0.11, 0.12, 0.13, 0.14), 30, 5, "length", sent_s=100.0)
    d = RequestTiming(0.105, (0.115, 0.125, 0.135, 0.15), 30, 5, "length", sent_s=100.0)
    steady = summarize([c, d], wall_s=0.5, engine_step_ms=10.0)
    # window [100.105, 100.14]: c's gaps .11-.12, .12-.13, .13-.14; d's .105-.115, .115-.125, .125-.135
    # (c's .10-.11 starts before d's first token; d's .135-.15 ends after c's last chunk)
    assert steady["steady_gaps"] == 6 and steady["client_tpot_ms_steady"] == pytest.approx(10.0)
    assert steady["loss_pct_steady"] == pytest.approx(0.0, abs=0.05)
    assert row["client_tpot_ms_mean"] == pytest.approx(12.5)
    assert row["client_tpot_ms_p50"] == pytest.approx(10.0)
    assert row["tokens_per_chunk"] == pytest.approx(8 / 6, abs=1e-3)
    assert row["ttft_ms_mean"] == pytest.approx(150.0) and row["loss_pct"] == pytest.approx(25.0)
    assert row["client_tok_s"] == pytest.approx(20.0) and row["completion_tokens"] == [5]
