"""loadtest/report.py: quantiles, goodput against SLOs, cached share, per-group rows, the files."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path
from typing import Any

from ninfer_loadtest_report import distribution, quantile, summarize, write_results  # see conftest.py
from ninfer_loadtest_text import code, prose


def _record(i: int, **over: Any) -> dict[str, Any]:
    base = {"ok": True, "group": f"turn {i % 2}", "turn": i % 2, "start": float(i), "end": i + 1.0,
            "ttft_s": 0.1 * (i + 1), "tpot_s": 0.01, "itl_s": [0.01, 0.02], "e2e_s": 1.0,
            "output_tokens": 10, "prompt_tokens": 100, "cached_tokens": 50 * (i % 2)}  # fmt: skip
    return {**base, **over}


def test_quantile_matches_linear_interpolation() -> None:
    values = [float(v) for v in range(1, 101)]
    assert quantile(values, 0.5) == 50.5
    assert abs(quantile(values, 0.99) - 99.01) < 1e-9
    assert distribution([])["p50"] is None
    assert distribution([3.0])["p99"] == 3.0


def test_summary_goodput_groups_and_files(tmp_path: Path) -> None:
    records = [_record(i) for i in range(10)] + [_record(10, ok=False, error="boom")]
    summary = summarize(records, {"ttft_s": 0.5}, {"profile": "t", "duration_s": 10.0})
    overall = summary["overall"]
    assert (overall["requests"], overall["ok"], overall["failed"]) == (11, 10, 1)
    assert overall["goodput"]["requests"] == 5  # ttft 0.1 .. 0.5 meet the SLO
    assert abs(overall["goodput"]["requests_per_s"] - 0.5) < 1e-9
    assert abs(overall["cached_token_share"] - 0.25) < 1e-9
    assert overall["itl_s"]["count"] == 20
    assert set(summary["by_group"]) == {"turn 0", "turn 1"}
    assert summary["later_turns"] == {"requests": 5, "without_cached_tokens": 0}
    first_turns_only = summarize([_record(0), _record(2)], {}, {"profile": "t", "duration_s": 2.0})
    assert first_turns_only["later_turns"] == {"requests": 0, "without_cached_tokens": 0}  # said, not absent
    untracked = summarize([_record(0, turn=None)], {}, {"profile": "t", "duration_s": 1.0})
    assert "later_turns" not in untracked  # profiles without sessions have no turns
    write_results(tmp_path, records, summary)
    assert json.loads((tmp_path / "summary.json").read_text())["overall"]["failed"] == 1
    rows = list(csv.DictReader(open(tmp_path / "summary.csv")))
    assert [r["group"] for r in rows] == ["overall", "group:turn 0", "group:turn 1"]
    assert rows[0]["ttft_s_p99"] and rows[0]["goodput_share"]
    assert len((tmp_path / "records.jsonl").read_text().splitlines()) == 11


def test_synthetic_text_is_deterministic_and_sized() -> None:
    assert prose(50, random.Random(1)) == prose(50, random.Random(1))
    assert len(prose(50, random.Random(1)).split()) == 50
    assert 20 < len(code(200, random.Random(2)).splitlines()) < 200
