"""Turn engine statistics and finished-request records into metric updates.

The engine never imports `monitor`; it hands up plain data, and these functions read it:

- engine statistics: `engine.core.EngineStats` (a dataclass), or the same fields as a mapping (the `engine`
  block of `GET /stats`). Gauges are set; cumulative counters become increments against the previous
  snapshot (a counter that went down means the engine restarted: its new value is the increment).
- request records: the dict the request log writes for `request_done` / `request_rejected` (see
  `api/request_log.py`): `protocol`, `result{...}`, `timings_seconds{...}`, optional `speculative{...}`.

`*_updates()` are pure: they return `Update`s and touch nothing. `apply()` performs them on a
`ServerMetrics`; `observe_*()` are the one-call forms the API uses.

Engine statistics fields read (all optional except where the engine already has them):

    num_running, num_waiting, max_concurrency, num_pages, num_pages_used, num_checkpoints    gauges
    num_pages_cached; num_pages_reclaimable (kv usage = (used - reclaimable) / pages)        gauge
    num_steps, num_forward_steps, num_admission_scans, num_prefill_tokens, num_decode_tokens counters
    num_prefill_steps, num_mixed_steps, num_burst_holds, num_burst_timeouts                  counters
    num_preemptions, num_recomputed_tokens                                                   counters
    num_requests_rejected: {code: n}                                                         counter
    host_kv_used_bytes, host_kv_capacity_bytes                                               gauges
    host_kv_park_bytes, host_kv_park_seconds, host_kv_restore_bytes, host_kv_restore_seconds counters
    host_kv_parks, host_kv_restores                                                          counters
    host_kv_evictions, host_kv_park_skips, host_kv_park_refusals: {reason: n}                counters
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from monitor.metrics import SPEC_POSITIONS, ServerMetrics

Op = Literal["inc", "set", "observe"]


@dataclass(frozen=True, slots=True)
class Update:
    """One change: `metric` is the attribute name on `ServerMetrics` (e.g. "ttft", "requests")."""

    metric: str
    op: Op
    value: float
    labels: tuple[tuple[str, str], ...] = ()


# request-log `protocol` -> the `api` label (the routes write "chat.completions", "openai.responses" and
# "anthropic.messages"; the short names are older logs')
API_LABELS = {
    "chat.completions": "openai_chat",
    "openai_chat": "openai_chat",
    "openai.responses": "openai_responses",
    "responses": "openai_responses",
    "openai_responses": "openai_responses",
    "anthropic.messages": "anthropic",
    "messages": "anthropic",
    "anthropic": "anthropic",
}
_GAUGES = (
    ("num_running", "running"),
    ("num_waiting", "waiting"),
    ("max_concurrency", "lanes"),
    ("num_pages", "kv_pages"),
    ("num_pages_used", "kv_pages_used"),
    ("num_pages_cached", "kv_pages_cached"),
    ("num_checkpoints", "checkpoints"),
    ("host_kv_used_bytes", "host_used"),
    ("host_kv_capacity_bytes", "host_capacity"),
)
_COUNTERS = (
    ("num_steps", "steps"),
    ("num_forward_steps", "forward_steps"),
    ("num_admission_scans", "admission_scans"),
    ("num_prefill_steps", "prefill_steps"),
    ("num_mixed_steps", "mixed_steps"),
    ("num_burst_holds", "burst_holds"),
    ("num_burst_timeouts", "burst_timeouts"),
    ("num_preemptions", "preemptions"),
    ("num_recomputed_tokens", "recomputed_tokens"),
    ("num_prefill_tokens", "prefill_tokens"),
    ("num_decode_tokens", "decode_tokens"),
    ("host_kv_park_bytes", "host_park_bytes"),
    ("host_kv_park_seconds", "host_park_seconds"),
    ("host_kv_restore_bytes", "host_restore_bytes"),
    ("host_kv_restore_seconds", "host_restore_seconds"),
    ("host_kv_parks", "host_parks"),
    ("host_kv_restores", "host_restores"),
)
_LABELLED_COUNTERS = (
    ("num_requests_rejected", "engine_rejected", "code"),
    ("host_kv_evictions", "host_evictions", "reason"),
    ("host_kv_park_skips", "host_park_skips", "reason"),
    ("host_kv_park_refusals", "host_park_refusals", "reason"),
)
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9_.:-]{1,48}$")


def as_mapping(stats: object) -> Mapping[str, Any]:
    """A dataclass, a mapping or a plain object, as a mapping of its public fields."""
    if stats is None:
        return {}
    if isinstance(stats, Mapping):
        return stats
    if dataclasses.is_dataclass(stats) and not isinstance(stats, type):
        return {f.name: getattr(stats, f.name) for f in dataclasses.fields(stats)}
    return {k: v for k, v in vars(stats).items() if not k.startswith("_")}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _label(value: Any, default: str = "other") -> str:
    text = str(value) if value is not None else ""
    return text if _LABEL_VALUE.match(text) else default


def _increment(current: float, previous: float | None) -> float:
    if previous is None or current < previous:  # first snapshot, or the engine restarted
        return current
    return current - previous


def kv_usage(engine: Mapping[str, Any]) -> float | None:
    """The device KV pool's load from engine statistics (a mapping): the fraction of pages that requests hold.
    Pages only prefix checkpoints hold (`num_pages_reclaimable`) count as free, as vLLM counts its cached free
    blocks: admission evicts them when it needs pages, so an idle server whose checkpoints fill the pool reads 0,
    not 1. None without the page counts."""
    pages, used = _number(engine.get("num_pages")), _number(engine.get("num_pages_used"))
    if pages is None or used is None:
        return None
    held = used - (_number(engine.get("num_pages_reclaimable")) or 0.0)
    return held / pages if pages > 0 else 0.0


def engine_updates(stats: object, previous: object | None = None) -> list[Update]:
    """Gauge sets and counter increments from one engine snapshot (`previous` = the last one applied)."""
    now, before = as_mapping(stats), as_mapping(previous)
    out: list[Update] = []
    for key, metric in _GAUGES:
        value = _number(now.get(key))
        if value is not None:
            out.append(Update(metric, "set", value))
    usage = kv_usage(now)
    if usage is not None:
        out.append(Update("kv_usage", "set", usage))
    for key, metric in _COUNTERS:
        value = _number(now.get(key))
        if value is None:
            continue
        delta = _increment(value, _number(before.get(key)) if previous is not None else None)
        if delta > 0:
            out.append(Update(metric, "inc", delta))
    for key, metric, label in _LABELLED_COUNTERS:
        counts = now.get(key)
        if not isinstance(counts, Mapping):
            continue
        old = before.get(key) if previous is not None else None
        old = old if isinstance(old, Mapping) else {}
        for name, value in counts.items():
            number = _number(value)
            if number is None:
                continue
            delta = _increment(number, _number(old.get(name)) if previous is not None else None)
            if delta > 0:
                out.append(Update(metric, "inc", delta, ((label, _label(name)),)))
    return out


def request_updates(record: Mapping[str, Any]) -> list[Update]:
    """Updates for one `request_done` or `request_rejected` record of the request log."""
    api = API_LABELS.get(str(record.get("protocol")), _label(record.get("protocol"), "unknown"))
    if record.get("event") == "request_rejected":
        code = _label(record.get("code"))
        return [
            Update("requests", "inc", 1, (("api", api), ("finish_reason", "rejected"))),
            Update("requests_rejected", "inc", 1, (("api", api), ("code", code))),
        ]
    result = record.get("result") or {}
    timings = record.get("timings_seconds") or {}
    finish = _label(result.get("finish_reason"), "error")
    out = [Update("requests", "inc", 1, (("api", api), ("finish_reason", finish)))]
    prompt = _number(result.get("prompt_tokens")) or 0.0
    completion = _number(result.get("completion_tokens")) or 0.0
    cached = min(_number(result.get("prefix_cache_hit_tokens")) or 0.0, prompt)
    host = min(_number(result.get("host_cache_hit_tokens")) or 0.0, cached)
    out += [
        Update("prompt_tokens", "inc", prompt),
        Update("generation_tokens", "inc", completion),
        Update("request_prompt_tokens", "observe", prompt),
        Update("request_generation_tokens", "observe", completion),
        Update("prefix_queries", "inc", prompt),
        Update("prefix_hits", "inc", cached),
        Update("prompt_tokens_by_source", "inc", prompt - cached, (("source", "computed"),)),
        Update("prompt_tokens_by_source", "inc", cached - host, (("source", "device_cache"),)),
        Update("prompt_tokens_by_source", "inc", host, (("source", "host_cache"),)),
        Update("prefix_reuse_path", "inc", 1, (("path", _reuse_path(result, cached, host)),)),
    ]
    ttft, total = _number(timings.get("ttft")), _number(timings.get("total"))
    queue = _number(timings.get("queue"))
    if queue is None:
        queue = _number((record.get("engine_timing") or {}).get("queue_wait_seconds"))
    prefill, decode = _number(timings.get("prefill")), _number(timings.get("decode"))
    if prefill is None and ttft is not None and queue is not None:
        prefill = max(ttft - queue, 0.0)
    for metric, value in (("ttft", ttft), ("e2e", total), ("queue", queue), ("prefill", prefill)):
        if value is not None:
            out.append(Update(metric, "observe", value))
    if decode is not None and ttft is not None:
        out.append(Update("decode", "observe", decode))
    if ttft is not None and total is not None and completion > 1:
        out.append(Update("tpot", "observe", max(total - ttft, 0.0) / (completion - 1)))
    out += _spec_updates(record.get("speculative") or {})
    return [u for u in out if u.op != "inc" or u.value > 0]


def _reuse_path(result: Mapping[str, Any], cached: float, host: float) -> str:
    path = result.get("prefix_reuse_path")
    if path in ("none", "checkpoint", "host_restore"):
        return str(path)
    if host > 0:
        return "host_restore"
    return "checkpoint" if cached > 0 else "none"


def _spec_updates(spec: Mapping[str, Any]) -> list[Update]:
    out = [
        Update("spec_drafts", "inc", _number(spec.get("rounds")) or 0.0),
        Update("spec_draft_tokens", "inc", _number(spec.get("drafted_tokens")) or 0.0),
        Update("spec_accepted_tokens", "inc", _number(spec.get("accepted_tokens")) or 0.0),
    ]
    per_pos = spec.get("accepted_per_position")
    if isinstance(per_pos, Sequence) and not isinstance(per_pos, str):
        for pos, value in enumerate(per_pos[:SPEC_POSITIONS]):
            out.append(
                Update("spec_accepted_per_pos", "inc", _number(value) or 0.0, (("position", str(pos)),))
            )
    return out


def token_gap_updates(gap_seconds: float, num_tokens: int = 1) -> list[Update]:
    """Inter-token latency for one streamed chunk: `num_tokens` gaps of `gap_seconds / num_tokens`."""
    if num_tokens < 1 or not gap_seconds >= 0:
        return []
    return [Update("itl", "observe", gap_seconds / num_tokens)] * num_tokens


def apply(metrics: ServerMetrics, updates: Sequence[Update]) -> None:
    for u in updates:
        metric = getattr(metrics, u.metric)
        target = metric.labels(**dict(u.labels)) if u.labels else metric
        if u.op == "inc":
            target.inc(u.value)
        elif u.op == "set":
            target.set(u.value)
        else:
            target.observe(u.value)


def observe_engine(metrics: ServerMetrics, stats: object, *, in_flight: int | None = None) -> None:
    """Refresh from `AsyncEngine.stats()` (call it right before rendering `/metrics`)."""
    snapshot = dict(as_mapping(stats))  # copied: a mapping the caller mutates must not become `previous`
    with metrics.lock:
        updates = engine_updates(snapshot, metrics.previous)
        metrics.previous = snapshot
        if in_flight is not None:
            updates.append(Update("in_flight", "set", float(in_flight)))
        apply(metrics, updates)
        for u in updates:
            if u.metric in ("waiting", "running", "kv_usage"):
                metrics.alias_values[u.metric] = u.value


def observe_request(metrics: ServerMetrics, record: Mapping[str, Any]) -> None:
    """Count one finished (`request_done`) or refused (`request_rejected`) request."""
    apply(metrics, request_updates(record))


def observe_token_gap(metrics: ServerMetrics, gap_seconds: float, num_tokens: int = 1) -> None:
    apply(metrics, token_gap_updates(gap_seconds, num_tokens))
