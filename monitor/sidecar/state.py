"""The sidecar's memory: recent samples (one per poll), recent request events, rolling aggregates.

Fed by `ingest()` (request-log records) and `sample()` (one `/stats` poll plus host readings). Read by
`snapshot()` (the `/api/samples` JSON and the page) and `export()` (the sidecar's `/metrics`). Thread-safe:
the poller thread writes while HTTP threads read.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from typing import Any

from monitor.collect import API_LABELS, as_mapping, kv_usage
from monitor.metrics import FINISH_REASONS, REUSE_PATHS, SidecarMetrics


def quantile(values: list[float], q: float) -> float | None:
    """Linear-interpolated quantile of `values` (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def request_event(record: Mapping[str, Any]) -> dict[str, Any]:
    """The per-request row the page lists, from a `request_done` record."""
    result = record.get("result") or {}
    timings = record.get("timings_seconds") or {}
    spec = record.get("speculative") or {}
    ttft, decode = _num(timings.get("ttft")), _num(timings.get("decode"))
    queue = _num(timings.get("queue"))
    if queue is None:
        queue = _num((record.get("engine_timing") or {}).get("queue_wait_seconds"))
    completion = _num(result.get("completion_tokens")) or 0.0
    cached = _num(result.get("prefix_cache_hit_tokens")) or 0.0
    host = _num(result.get("host_cache_hit_tokens")) or 0.0
    path = result.get("prefix_reuse_path")
    if path not in REUSE_PATHS:
        path = "host_restore" if host > 0 else "checkpoint" if cached > 0 else "none"
    return {
        "t": record.get("timestamp_unix_ms"),
        "id": record.get("request_id"),
        "api": API_LABELS.get(str(record.get("protocol")), str(record.get("protocol"))),
        "finish_reason": result.get("finish_reason") or "error",
        "prompt_tokens": _num(result.get("prompt_tokens")) or 0.0,
        "completion_tokens": completion,
        "prefix_hit_tokens": cached,
        "host_hit_tokens": host,
        "prefix_path": path,
        "ttft": ttft,
        "queue": queue,
        "proc": None if ttft is None or queue is None else max(ttft - queue, 0.0),
        "decode_tps": completion / decode if decode and completion > 1 else None,
        "drafted": _num(spec.get("drafted_tokens")) or 0.0,
        "accepted": _num(spec.get("accepted_tokens")) or 0.0,
        "rounds": _num(spec.get("rounds")) or 0.0,
    }


def engine_block(stats: Mapping[str, Any]) -> Mapping[str, Any]:
    """The engine statistics inside a `/stats` answer (`engine` block; the top level as a fallback)."""
    block = stats.get("engine")
    return as_mapping(block) if isinstance(block, Mapping) else stats


class MonitorState:
    def __init__(self, *, max_samples: int = 4320, max_events: int = 2000, window_seconds: float = 3600.0,
                 stale_after_seconds: float = 60.0, metrics: SidecarMetrics | None = None) -> None:  # fmt: skip
        self.lock = threading.Lock()
        self.samples: deque[dict[str, Any]] = deque(maxlen=max_samples)
        self.events: deque[dict[str, Any]] = deque(maxlen=max_events)
        self.window_seconds = window_seconds
        self.stale_after_seconds = stale_after_seconds
        self.metrics = metrics or SidecarMetrics()
        self.rejected: deque[float] = deque(maxlen=max_events)  # arrival times (unix s) of refusals
        self.errors: deque[float] = deque(maxlen=max_events)
        self.server: dict[str, Any] = {"up": False, "last_stats_unix_ms": None, "instance_id": None,
                                       "model": None, "last_log_unix_ms": None}  # fmt: skip
        self._last_counters: tuple[float, float, float] | None = None  # (time, prefill, decode)
        self._window_tokens: deque[tuple[float, float]] = deque()  # (time, completion tokens) from the log

    # ---- inputs ---------------------------------------------------------------------------------

    def ingest(self, records: Iterable[Mapping[str, Any]], now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self.lock:
            for record in records:
                self.metrics.log_lines.inc()
                event = record.get("event")
                t_ms = record.get("timestamp_unix_ms")
                stamp = float(t_ms) / 1000 if isinstance(t_ms, int | float) else now
                self.server["last_log_unix_ms"] = int(stamp * 1000)
                if record.get("server_instance_id"):
                    self.server["instance_id"] = record["server_instance_id"]
                if event == "server_start":
                    self.server["model"] = record.get("served_model_id") or record.get("model_id")
                elif event == "request_done":
                    row = request_event(record)
                    row["t"] = int(stamp * 1000)
                    self.events.append(row)
                    self._window_tokens.append((stamp, row["completion_tokens"]))
                elif event == "request_rejected":
                    self.rejected.append(stamp)
                elif event == "request_error":
                    self.errors.append(stamp)

    def sample(self, stats: Mapping[str, Any] | None, *, gpus: list[dict[str, Any]] | None = None,
               cpu_pct: float | None = None, ram: dict[str, float] | None = None,
               now: float | None = None) -> dict[str, Any]:  # fmt: skip
        """Record one poll (`stats` None = the poll failed) and return the new sample."""
        now = time.time() if now is None else now
        with self.lock:
            self.metrics.polls.labels(result="ok" if stats is not None else "error").inc()
            engine = engine_block(stats) if stats is not None else {}
            if stats is not None:
                self.server["last_stats_unix_ms"] = int(now * 1000)
                load = stats.get("load") or {}
                self.server["model"] = (
                    load.get("served_model_id") or load.get("model_id") or self.server["model"]
                )
            self.server["up"] = self._fresh(now)
            prefill_tps, decode_tps = self._rates(engine, now)
            sample = {
                "t": int(now * 1000),
                "up": self.server["up"],
                "running": _num(engine.get("num_running")),
                "waiting": _num(engine.get("num_waiting")),
                "in_flight": _num((stats or {}).get("http", {}).get("in_flight")) if stats else None,
                "kv_usage": kv_usage(engine),
                "host_kv_used_bytes": _num(engine.get("host_kv_used_bytes")),
                "host_kv_capacity_bytes": _num(engine.get("host_kv_capacity_bytes")),
                "prefill_tps": prefill_tps,
                "decode_tps": decode_tps,
                "rolling": self._rolling(now),
                "gpu": gpus or [],
                "cpu_pct": cpu_pct,
                "ram": ram,
            }
            self.samples.append(sample)
            self._export(sample)
            return sample

    def _fresh(self, now: float) -> bool:
        limit = (now - self.stale_after_seconds) * 1000
        return any(t is not None and t >= limit
                   for t in (self.server["last_stats_unix_ms"], self.server["last_log_unix_ms"]))  # fmt: skip

    def _rates(self, engine: Mapping[str, Any], now: float) -> tuple[float | None, float | None]:
        """Token rates from the engine's cumulative counters; from the log when /stats lacks them."""
        prefill, decode = _num(engine.get("num_prefill_tokens")), _num(engine.get("num_decode_tokens"))
        if prefill is not None and decode is not None:
            last, self._last_counters = self._last_counters, (now, prefill, decode)
            if last is None or now <= last[0] or prefill < last[1] or decode < last[2]:  # first or reset
                return None, None
            dt = now - last[0]
            return (prefill - last[1]) / dt, (decode - last[2]) / dt
        if not self.samples:
            return None, None
        since = self.samples[-1]["t"] / 1000
        tokens = sum(n for t, n in self._window_tokens if t > since)
        return None, tokens / max(now - since, 1e-9)

    # ---- aggregates -----------------------------------------------------------------------------

    def _window(self, now: float) -> list[dict[str, Any]]:
        start = (now - self.window_seconds) * 1000
        while self._window_tokens and self._window_tokens[0][0] < now - self.window_seconds:
            self._window_tokens.popleft()
        return [e for e in self.events if e["t"] is not None and e["t"] >= start]

    def _rolling(self, now: float) -> dict[str, Any]:
        events = self._window(now)
        ttfts = [e["ttft"] for e in events if e["ttft"] is not None]
        queues = [e["queue"] for e in events if e["queue"] is not None]
        prompt = sum(e["prompt_tokens"] for e in events)
        hits = sum(e["prefix_hit_tokens"] for e in events)
        drafted = sum(e["drafted"] for e in events)
        accepted = sum(e["accepted"] for e in events)
        rounds = sum(e["rounds"] for e in events)
        paths = Counter(e["prefix_path"] for e in events)
        return {
            "requests": len(events),
            "ttft_p50": quantile(ttfts, 0.5),
            "ttft_p95": quantile(ttfts, 0.95),
            "ttft_p99": quantile(ttfts, 0.99),
            "ttft_max": max(ttfts) if ttfts else None,
            "queue_p50": quantile(queues, 0.5),
            "queue_p95": quantile(queues, 0.95),
            "queue_p99": quantile(queues, 0.99),
            "prefix_hit_rate": hits / prompt if prompt else None,
            "reuse_paths": {p: paths.get(p, 0) for p in REUSE_PATHS},
            "mtp_accept_rate": accepted / drafted if drafted else None,
            "mtp_tokens_per_round": 1 + accepted / rounds if rounds else None,
            "by_finish": dict(Counter(e["finish_reason"] for e in events)),
        }

    def _export(self, sample: dict[str, Any]) -> None:
        m, rolling = self.metrics, sample["rolling"]
        m.server_up.set(1 if sample["up"] else 0)
        for p in ("50", "95", "99"):
            m.ttft.labels(percentile=p).set(_nan(rolling[f"ttft_p{p}"]))
            m.queue.labels(percentile=p).set(_nan(rolling[f"queue_p{p}"]))
        m.prefix_hit.set(_nan(rolling["prefix_hit_rate"]))
        total = rolling["requests"]
        for path, n in rolling["reuse_paths"].items():
            m.reuse_path.labels(path=path).set(n / total if total else float("nan"))
        m.spec_accept.set(_nan(rolling["mtp_accept_rate"]))
        m.decode_tps.set(_nan(sample["decode_tps"]))
        m.prefill_tps.set(_nan(sample["prefill_tps"]))
        for reason in set(FINISH_REASONS) | set(rolling["by_finish"]):
            if reason in FINISH_REASONS:
                m.window_requests.labels(finish_reason=reason).set(rolling["by_finish"].get(reason, 0))
        for gpu in sample["gpu"]:
            g = str(gpu["index"])
            if gpu["util_pct"] is not None:
                m.gpu_util.labels(gpu=g).set(gpu["util_pct"] / 100)
            if gpu["mem_used_mb"] is not None:
                m.gpu_mem_used.labels(gpu=g).set(gpu["mem_used_mb"] * 1024 * 1024)
            if gpu["mem_total_mb"] is not None:
                m.gpu_mem_total.labels(gpu=g).set(gpu["mem_total_mb"] * 1024 * 1024)
            if gpu["power_w"] is not None:
                m.gpu_power.labels(gpu=g).set(gpu["power_w"])
            if gpu["temp_c"] is not None:
                m.gpu_temp.labels(gpu=g).set(gpu["temp_c"])

    # ---- outputs --------------------------------------------------------------------------------

    def snapshot(self, *, max_samples: int | None = None, max_events: int = 200) -> dict[str, Any]:
        """The `/api/samples` document."""
        now = time.time()
        with self.lock:
            samples = list(self.samples)[-max_samples:] if max_samples else list(self.samples)
            window = self._window(now)
            cutoff = now - self.window_seconds
            aggregates = {
                **self._rolling(now),
                "window_seconds": self.window_seconds,
                "requests": {
                    "done": len(window),
                    "rejected": sum(1 for t in self.rejected if t >= cutoff),
                    "errors": sum(1 for t in self.errors if t >= cutoff),
                },
            }
            return {
                "generated_unix_ms": int(now * 1000),
                "server": dict(self.server, up=self._fresh(now)),
                "latest": samples[-1] if samples else None,
                "samples": samples,
                "events": list(self.events)[-max_events:],
                "aggregates": aggregates,
            }


def _nan(value: float | None) -> float:
    return float("nan") if value is None else float(value)
