"""Load-test results: per-request records -> summary JSON and CSV (p50/p90/p99, goodput, cached share).

Pure Python (no locust import), so tests and notebooks can read results without gevent.

Definitions (vLLM / inference-perf; DEPLOY-NOTES.md §4.7):
- TTFT: first streamed token (content, reasoning or tool-call delta) minus send time.
- ITL: each gap between streamed chunks carrying tokens (per chunk; a chunk may carry several tokens).
- TPOT: (E2E - TTFT) / (output tokens - 1), from the server's usage count; none for 1-token outputs.
- Goodput: requests per second that succeeded and met every stated SLO (`ttft_s`, `tpot_s`, `e2e_s`);
  token goodput counts their output tokens.
- Cached-token share: sum(cached prompt tokens) / sum(prompt tokens) over successful requests.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

QUANTILES = (0.5, 0.9, 0.99)
LATENCY_KEYS = ("ttft_s", "tpot_s", "itl_s", "e2e_s")
COUNT_KEYS = ("prompt_tokens", "cached_tokens", "output_tokens")
SUMMARY_SCHEMA = "ninfer_loadtest_summary"


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of sorted-or-not `values` (numpy's default method)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def distribution(values: Sequence[float]) -> dict[str, float | int | None]:
    """count, mean, p50/p90/p99, max; None where there are no values."""
    if not values:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    return {
        "count": len(values),
        "mean": sum(values) / len(values),
        **{f"p{round(q * 100)}": quantile(values, q) for q in QUANTILES},
        "max": max(values),
    }


def meets_slo(record: Mapping[str, Any], slo: Mapping[str, float]) -> bool:
    """A successful request whose every SLO-named metric is present and within its bound."""
    if not record.get("ok"):
        return False
    for key, bound in slo.items():
        value = record.get(key)
        if key == "tpot_s" and value is None:
            continue  # one output token: no TPOT to violate
        if value is None or value > bound:
            return False
    return True


def group_summary(
    records: Sequence[Mapping[str, Any]], slo: Mapping[str, float], seconds: float
) -> dict[str, Any]:
    ok = [r for r in records if r.get("ok")]
    out: dict[str, Any] = {"requests": len(records), "ok": len(ok), "failed": len(records) - len(ok)}
    for key in LATENCY_KEYS:
        if key == "itl_s":
            values = [gap for r in ok for gap in r.get("itl_s") or ()]
        else:
            values = [r[key] for r in ok if r.get(key) is not None]
        out[key] = distribution(values)
    for key in COUNT_KEYS:
        out[key] = distribution([float(r.get(key) or 0) for r in ok])
    prompt = sum(int(r.get("prompt_tokens") or 0) for r in ok)
    cached = sum(int(r.get("cached_tokens") or 0) for r in ok)
    out["cached_token_share"] = cached / prompt if prompt else 0.0
    good = [r for r in ok if meets_slo(r, slo)]
    seconds = max(seconds, 1e-9)
    out["goodput"] = {
        "requests": len(good),
        "share": len(good) / len(records) if records else 0.0,
        "requests_per_s": len(good) / seconds,
        "output_tokens_per_s": sum(int(r.get("output_tokens") or 0) for r in good) / seconds,
    }
    out["throughput"] = {
        "requests_per_s": len(ok) / seconds,
        "output_tokens_per_s": sum(int(r.get("output_tokens") or 0) for r in ok) / seconds,
    }
    return out


def _span(records: Sequence[Mapping[str, Any]]) -> float:
    if not records:
        return 0.0
    return max(r["end"] for r in records) - min(r["start"] for r in records)


def summarize(
    records: Sequence[Mapping[str, Any]], slo: Mapping[str, float], meta: Mapping[str, Any]
) -> dict[str, Any]:
    """The summary document: overall, `by_group` (turn, rung, stage, ... as the profile labels them)
    and, where records carry a `kind` (cold / resumed), `by_kind`."""
    seconds = float(meta.get("duration_s") or _span(records))
    groups: dict[str, list[Mapping[str, Any]]] = {}
    kinds: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        groups.setdefault(str(r.get("group", "all")), []).append(r)
        if r.get("kind"):
            kinds.setdefault(str(r["kind"]), []).append(r)
    summary: dict[str, Any] = {
        "schema": SUMMARY_SCHEMA,
        **meta,
        "slo": dict(slo),
        "overall": group_summary(records, slo, seconds),
        "by_group": {
            name: group_summary(rs, slo, _span(rs) or seconds) for name, rs in sorted(groups.items())
        },
    }
    if kinds:
        summary["by_kind"] = {
            name: group_summary(rs, slo, _span(rs) or seconds) for name, rs in kinds.items()
        }
    if any(isinstance(r.get("turn"), int) for r in records):  # the session profiles: say it even when 0
        turns = [r for r in records if r.get("ok") and isinstance(r.get("turn"), int) and r["turn"] > 0]
        summary["later_turns"] = {
            "requests": len(turns),
            "without_cached_tokens": sum(1 for r in turns if not r.get("cached_tokens")),
        }
    return summary


CSV_FIELDS = (
    ["group", "requests", "ok", "failed", "cached_token_share", "goodput_share", "goodput_rps"]
    + [f"{key}_{stat}" for key in LATENCY_KEYS for stat in ("p50", "p90", "p99", "mean")]
    + ["output_tokens_mean", "prompt_tokens_mean", "cached_tokens_mean"]
)


def csv_rows(summary: Mapping[str, Any]) -> Iterable[dict[str, Any]]:
    sections = [("overall", summary["overall"])]
    sections += [(f"group:{k}", v) for k, v in summary.get("by_group", {}).items()]
    sections += [(f"kind:{k}", v) for k, v in summary.get("by_kind", {}).items()]
    for name, g in sections:
        row: dict[str, Any] = {
            "group": name,
            "requests": g["requests"],
            "ok": g["ok"],
            "failed": g["failed"],
            "cached_token_share": round(g["cached_token_share"], 4),
            "goodput_share": round(g["goodput"]["share"], 4),
            "goodput_rps": round(g["goodput"]["requests_per_s"], 4),
        }
        for key in LATENCY_KEYS:
            for stat in ("p50", "p90", "p99", "mean"):
                value = g[key][stat]
                row[f"{key}_{stat}"] = "" if value is None else round(value, 6)
        for key in ("output_tokens", "prompt_tokens", "cached_tokens"):
            value = g[key]["mean"]
            row[f"{key}_mean"] = "" if value is None else round(value, 2)
        yield row


def write_results(out_dir: Path, records: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]) -> None:
    """records.jsonl (one request per line), summary.json, summary.csv (one row per group)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "records.jsonl", "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")
    with open(out_dir / "summary.csv", "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(csv_rows(summary))


def load_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def server_breakdown(request_log: Path, since_unix: float) -> dict[str, Any]:
    """The server's own view of the run, from its request log (`ninfer-serve --request-log-jsonl`):
    requests finished since `since_unix`, grouped by how the prompt prefix was reused (`none`, `checkpoint`
    = device prefix cache, `host_restore` = restored from host RAM), with the server-side queue, prefill
    (admission to first token) and TTFT seconds and the reused tokens. Client TTFT mixes queueing for a
    lane with prefill; this separates them. `resumed_vs_cold_prefill_p50` = prefill p50 of requests that
    reused a prefix / of those that did not (None when either is missing)."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    with open(request_log, encoding="utf-8") as f:
        for line in f:
            event = json.loads(line)
            if event.get("event") != "request_done" or event.get("timestamp_unix_ms", 0) < since_unix * 1000:
                continue
            timings = event.get("timings_seconds") or {}
            if timings.get("prefill") is None:  # cut before its first token (e.g. stopped at the end)
                continue
            result = event["result"]
            groups.setdefault(result.get("prefix_reuse_path") or "none", []).append(
                {
                    **timings,
                    "cached": result.get("prefix_cache_hit_tokens", 0),
                    "host": result.get("host_cache_hit_tokens", 0),
                    "prompt": result["prompt_tokens"],
                }
            )
    by_path = {
        path: {
            "requests": len(rows),
            **{
                f"{key}_s": distribution([r[key] for r in rows if r.get(key) is not None])
                for key in ("queue", "prefill", "ttft")
            },
            "prompt_tokens": distribution([r["prompt"] for r in rows]),
            "cached_tokens": distribution([r["cached"] for r in rows]),
            "host_cached_tokens": distribution([r["host"] for r in rows]),
        }
        for path, rows in sorted(groups.items())
    }
    cold = [r["prefill"] for r in groups.get("none", [])]
    resumed = [r["prefill"] for path, rows in groups.items() if path != "none" for r in rows]
    ratio = quantile(resumed, 0.5) / quantile(cold, 0.5) if cold and resumed and quantile(cold, 0.5) else None
    return {"by_reuse_path": by_path, "resumed_vs_cold_prefill_p50": ratio}
