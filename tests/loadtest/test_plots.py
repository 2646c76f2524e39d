"""loadtest/plots.py: each PNG is drawn from the records that carry its data, and only then."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ninfer_loadtest_plots import PLOTS, write_plots  # see conftest.py

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _record(**over: Any) -> dict[str, Any]:
    base = {"ok": True, "ttft_s": 0.2, "tpot_s": 0.02, "itl_s": [0.02, 0.03], "prompt_tokens": 100,
            "cached_tokens": 0, "output_tokens": 8}  # fmt: skip
    return {**base, **over}


def test_every_plot_is_drawn_when_its_data_is_there(tmp_path: Path) -> None:
    records = [_record(rung=size, prompt_tokens=size, ttft_s=size / 1000) for size in (64, 64, 256, 256)]
    records += [_record(kind="cold", turn=0, ttft_s=0.5), _record(kind="resumed", turn=1, ttft_s=0.1,
                                                                  cached_tokens=90)]  # fmt: skip
    records.append({"ok": False, "error": "boom"})  # failed requests are left out, not fatal
    written = write_plots(tmp_path, records)
    assert sorted(p.name for p in written) == sorted(PLOTS)
    for path in written:
        assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 5000


def test_plots_without_their_data_are_skipped(tmp_path: Path) -> None:
    written = write_plots(tmp_path, [_record()])  # no kind, no turn
    assert sorted(p.name for p in written) == ["itl_tpot.png", "ttft_vs_prompt.png"]
    assert write_plots(tmp_path / "none", []) == []
