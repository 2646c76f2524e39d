"""Load-test plots (matplotlib PNGs) from a results folder's per-request records; no locust import.

  write_plots(results_dir, records) -> the PNG paths written (each only when its data is there)

ttft_vs_prompt.png        TTFT against prompt tokens, every request, with the median per size
                          (prefill_ladder's rungs; any profile)
ttft_resumed_vs_cold.png  TTFT of resumed turns against cold first turns (park_resume's `kind`)
itl_tpot.png              ITL (every gap between token-carrying chunks) and per-request TPOT distributions
cached_share_by_turn.png  cached prompt tokens / prompt tokens per agent turn (agent_sessions_long,
                          park_resume: every turn after the first should be mostly cached)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

Record = Mapping[str, Any]


def _ok(records: Sequence[Record]) -> list[Record]:
    return [r for r in records if r.get("ok")]


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def ttft_vs_prompt(records: Sequence[Record], path: Path) -> Path | None:
    points = [(r["prompt_tokens"], r["ttft_s"]) for r in _ok(records) if r.get("ttft_s") is not None]
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([p for p, _ in points], [t for _, t in points], s=10, alpha=0.5, label="request")
    by_size: dict[int, list[float]] = defaultdict(list)
    for record in _ok(records):
        if record.get("ttft_s") is not None:
            by_size[int(record.get("rung") or record["prompt_tokens"])].append(record["ttft_s"])
    if any(len(v) > 1 for v in by_size.values()):
        sizes = sorted(by_size)
        ax.plot(sizes, [_median(by_size[s]) for s in sizes], "o-", color="C3", label="median per size")
    ax.set(xlabel="prompt tokens", ylabel="TTFT (s)", title="Time to first token against prompt length")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def ttft_resumed_vs_cold(records: Sequence[Record], path: Path) -> Path | None:
    kinds: dict[str, list[float]] = {"cold": [], "resumed": []}
    for record in _ok(records):
        if record.get("kind") in kinds and record.get("ttft_s") is not None:
            kinds[record["kind"]].append(record["ttft_s"])
    if not kinds["cold"] or not kinds["resumed"]:
        return None
    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.boxplot([kinds["cold"], kinds["resumed"]], showfliers=True)
    ax.set_xticks([1, 2], [f"cold (n={len(kinds['cold'])})", f"resumed (n={len(kinds['resumed'])})"])
    ratio = _median(kinds["resumed"]) / _median(kinds["cold"])
    ax.set(ylabel="TTFT (s)", title=f"Resumed against cold turns: median ratio {ratio:.2f}")
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def itl_tpot(records: Sequence[Record], path: Path) -> Path | None:
    itl = [gap * 1000 for r in _ok(records) for gap in r.get("itl_s") or []]
    tpot = [r["tpot_s"] * 1000 for r in _ok(records) if r.get("tpot_s") is not None]
    if not itl and not tpot:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, values, name in ((axes[0], itl, "ITL (each gap)"), (axes[1], tpot, "TPOT (per request)")):
        if values:
            ax.hist(values, bins=40, color="C0", alpha=0.8)
            p50 = _median(values)
            ax.axvline(p50, color="C3", linestyle="--", label=f"p50 {p50:.1f} ms")
            ax.legend()
        ax.set(xlabel="ms", ylabel="count", title=f"{name}, n={len(values)}")
        ax.grid(alpha=0.3)
    return _save(fig, path)


def cached_share_by_turn(records: Sequence[Record], path: Path) -> Path | None:
    prompt: dict[int, int] = defaultdict(int)
    cached: dict[int, int] = defaultdict(int)
    for record in _ok(records):
        if record.get("turn") is not None and record.get("prompt_tokens"):
            prompt[int(record["turn"])] += int(record["prompt_tokens"])
            cached[int(record["turn"])] += int(record.get("cached_tokens") or 0)
    if not prompt:
        return None
    turns = sorted(prompt)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(turns, [cached[t] / prompt[t] for t in turns], color="C2")
    ax.set(
        xlabel="turn", ylabel="cached / prompt tokens", ylim=(0, 1.05), title="Cached-token share per turn"
    )
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


PLOTS = {
    "ttft_vs_prompt.png": ttft_vs_prompt,
    "ttft_resumed_vs_cold.png": ttft_resumed_vs_cold,
    "itl_tpot.png": itl_tpot,
    "cached_share_by_turn.png": cached_share_by_turn,
}


def write_plots(results: Path, records: Sequence[Record]) -> list[Path]:
    written = []
    for name, plot in PLOTS.items():
        out = plot(records, results / name)
        if out is not None:
            written.append(out)
    return written
