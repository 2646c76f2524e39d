"""Every Prometheus metric NInfer exports, defined once.

Two sets, each a class that registers its metrics on its own `CollectorRegistry` (so tests and several
apps in one process never collide on the global registry):

- `ServerMetrics`: what `ninfer-serve` serves at `/metrics`. Filled by `monitor.collect` from the engine's
  `stats()` snapshot (gauges and step counters) and from each finished request's record (the same dict
  the request log writes as `request_done`).
- `SidecarMetrics`: what `ninfer-monitor` serves at `/metrics`: rolling aggregates it computes from the
  request log and `/stats` (`ninfer_monitor_*`).

Names follow DESIGN.md: prefix `ninfer_`, counters end in `_total`, times in `_seconds`, sizes in `_bytes`,
fractions in `_ratio`. `EXTERNAL_METRICS` lists the metrics dashboards may use that other exporters own
(DCGM, kube-state-metrics, Prometheus itself); `dashboard_metric_names()` is the full allowed set.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from importlib import metadata

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Bucket boundaries: OTel's recommended server boundaries at the low end, extended so that a 200k-token
# prefill or a long agent turn still lands in a finite bucket (histogram_quantile stays meaningful).
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1280.0,
)  # fmt: skip
TOKEN_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
    5.0, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_SECONDS_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0,
    1280.0, 2560.0, 3600.0,
)  # fmt: skip
TOKEN_COUNT_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 32768, 65536, 131072, 262144, 524288)

# Bounded label values (pre-created so every series exists from the first scrape, as vLLM does).
APIS = ("openai_chat", "openai_responses", "anthropic")
FINISH_REASONS = ("stop", "length", "context", "aborted", "client_disconnected", "rejected", "error")
REJECT_CODES = ("server_overloaded", "request_queue_timeout", "context_length_exceeded", "request_too_large")
PROMPT_SOURCES = ("computed", "device_cache", "host_cache")
HOST_EVICTION_REASONS = ("capacity", "superseded", "expired")
HOST_PARK_SKIP_REASONS = ("covered", "on_host")  # engine/scheduler/host.py
HOST_PARK_REFUSAL_REASONS = ("off", "oversize", "pinned")  # engine/cache/host.py _park_refusal
SPEC_POSITIONS = 5  # MTP drafts 1..5 tokens: positions 0..4
REUSE_PATHS = ("none", "checkpoint", "host_restore")

# Metrics that dashboards may reference but other exporters own.
EXTERNAL_METRICS: dict[str, str] = {
    "up": "Prometheus (scrape health)",
    "DCGM_FI_DEV_GPU_UTIL": "dcgm-exporter",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "dcgm-exporter",
    "DCGM_FI_DEV_FB_USED": "dcgm-exporter",
    "DCGM_FI_DEV_FB_FREE": "dcgm-exporter",
    "DCGM_FI_DEV_POWER_USAGE": "dcgm-exporter",
    "DCGM_FI_DEV_GPU_TEMP": "dcgm-exporter",
    "DCGM_FI_DEV_SM_CLOCK": "dcgm-exporter",
    "DCGM_FI_DEV_XID_ERRORS": "dcgm-exporter",
    "kube_deployment_status_replicas": "kube-state-metrics",
    "kube_deployment_status_replicas_available": "kube-state-metrics",
    "kube_deployment_status_replicas_unavailable": "kube-state-metrics",
    "kube_deployment_status_replicas_updated": "kube-state-metrics",
    "kube_deployment_spec_replicas": "kube-state-metrics",
    "kube_deployment_labels": "kube-state-metrics",
    "kube_pod_container_status_restarts_total": "kube-state-metrics",
    "kube_pod_container_status_ready": "kube-state-metrics",
}


def _version() -> str:
    try:
        return metadata.version("ninfer")
    except metadata.PackageNotFoundError:
        return "unknown"


class ServerMetrics:
    """The server's metrics on one registry. `monitor.collect` computes the updates; `render()` exposes."""

    def __init__(self, registry: CollectorRegistry | None = None, *, vllm_aliases: bool = False) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.lock = threading.Lock()  # guards `previous` and the alias values (scrapes run concurrently)
        self.previous: object | None = None  # the last engine stats seen (monitor.collect computes deltas)
        self.model_labels: dict[str, str] | None = None
        r = self.registry
        # -- requests (from each finished request's record) --
        self.requests = Counter(
            "ninfer_requests_total", "Requests that ended, by protocol and finish reason.",
            ["api", "finish_reason"], registry=r,
        )  # fmt: skip
        self.requests_rejected = Counter(
            "ninfer_requests_rejected_total", "Requests refused before admission, by reason code.",
            ["api", "code"], registry=r,
        )  # fmt: skip
        self.ttft = Histogram(
            "ninfer_time_to_first_token_seconds", "Time from arrival to the first output token.",
            registry=r, buckets=TTFT_BUCKETS,
        )  # fmt: skip
        self.itl = Histogram(
            "ninfer_inter_token_latency_seconds",
            "Gap between streamed tokens, per token (a chunk of k tokens counts k gaps of gap/k).",
            registry=r, buckets=TOKEN_LATENCY_BUCKETS,
        )  # fmt: skip
        self.tpot = Histogram(
            "ninfer_time_per_output_token_seconds",
            "Per request: (end-to-end - time to first token) / (output tokens - 1).",
            registry=r, buckets=TOKEN_LATENCY_BUCKETS,
        )  # fmt: skip
        self.e2e = Histogram(
            "ninfer_e2e_request_latency_seconds", "Time from arrival to the last token.",
            registry=r, buckets=REQUEST_SECONDS_BUCKETS,
        )  # fmt: skip
        self.queue = Histogram(
            "ninfer_request_queue_seconds", "Time a request waited for a lane before its prefill started.",
            registry=r, buckets=REQUEST_SECONDS_BUCKETS,
        )  # fmt: skip
        self.prefill = Histogram(
            "ninfer_request_prefill_seconds", "Time from admission to the first output token.",
            registry=r, buckets=REQUEST_SECONDS_BUCKETS,
        )  # fmt: skip
        self.decode = Histogram(
            "ninfer_request_decode_seconds", "Time from the first output token to the last.",
            registry=r, buckets=REQUEST_SECONDS_BUCKETS,
        )  # fmt: skip
        self.request_prompt_tokens = Histogram(
            "ninfer_request_prompt_tokens", "Prompt length per request (tokens).",
            registry=r, buckets=TOKEN_COUNT_BUCKETS,
        )  # fmt: skip
        self.request_generation_tokens = Histogram(
            "ninfer_request_generation_tokens", "Output length per request (tokens).",
            registry=r, buckets=TOKEN_COUNT_BUCKETS,
        )  # fmt: skip
        self.prompt_tokens = Counter(
            "ninfer_prompt_tokens_total",
            "Prompt tokens of finished requests (cached ones included).",
            registry=r,
        )
        self.generation_tokens = Counter(
            "ninfer_generation_tokens_total", "Output tokens of finished requests.", registry=r
        )
        self.prompt_tokens_by_source = Counter(
            "ninfer_prompt_tokens_by_source_total",
            "Prompt tokens by where their KV came from: computed, device prefix cache, host (RAM) cache.",
            ["source"], registry=r,
        )  # fmt: skip
        self.prefix_queries = Counter(
            "ninfer_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", registry=r
        )
        self.prefix_hits = Counter(
            "ninfer_prefix_cache_hits_total", "Prompt tokens found in the prefix cache (device or host).",
            registry=r,
        )  # fmt: skip
        self.prefix_reuse_path = Counter(
            "ninfer_prefix_reuse_path_total", "Requests by how their prompt's prefix was reused.",
            ["path"], registry=r,
        )  # fmt: skip
        self.spec_drafts = Counter(
            "ninfer_spec_decode_drafts_total", "Speculative verify rounds (one draft each).", registry=r
        )
        self.spec_draft_tokens = Counter(
            "ninfer_spec_decode_draft_tokens_total", "Draft tokens proposed.", registry=r
        )
        self.spec_accepted_tokens = Counter(
            "ninfer_spec_decode_accepted_tokens_total", "Draft tokens accepted.", registry=r
        )
        self.spec_accepted_per_pos = Counter(
            "ninfer_spec_decode_accepted_tokens_per_pos_total", "Draft tokens accepted at each draft position.",
            ["position"], registry=r,
        )  # fmt: skip
        # -- engine snapshot (from AsyncEngine.stats(), refreshed at each scrape) --
        self.running = Gauge("ninfer_requests_running", "Requests holding a lane.", registry=r)
        self.waiting = Gauge("ninfer_requests_waiting", "Requests queued for a lane.", registry=r)
        self.in_flight = Gauge("ninfer_http_requests_in_flight", "HTTP generation requests open.", registry=r)
        self.lanes = Gauge("ninfer_scheduler_lanes", "Lanes (--max-concurrency).", registry=r)
        self.kv_usage = Gauge(
            "ninfer_kv_cache_usage_ratio", "Fraction of device KV pages in use.", registry=r
        )
        self.kv_pages = Gauge("ninfer_kv_cache_pages", "Device KV pages in the pool.", registry=r)
        self.kv_pages_used = Gauge("ninfer_kv_cache_used_pages", "Device KV pages in use.", registry=r)
        self.checkpoints = Gauge(
            "ninfer_prefix_cache_checkpoints", "Prefix checkpoints held in the device cache.", registry=r
        )
        self.host_used = Gauge(
            "ninfer_host_kv_cache_used_bytes", "Host (RAM) KV cache bytes in use.", registry=r
        )
        self.host_capacity = Gauge(
            "ninfer_host_kv_cache_capacity_bytes",
            "Host (RAM) KV cache capacity (--host-kv-cache-mib).",
            registry=r,
        )
        self.host_park_bytes = Counter(
            "ninfer_host_kv_park_bytes_total", "Bytes copied device -> host when parking.", registry=r
        )
        self.host_park_seconds = Counter(
            "ninfer_host_kv_park_seconds_total", "Seconds spent parking device -> host.", registry=r
        )
        self.host_restore_bytes = Counter(
            "ninfer_host_kv_restore_bytes_total", "Bytes copied host -> device when restoring.", registry=r
        )
        self.host_restore_seconds = Counter(
            "ninfer_host_kv_restore_seconds_total", "Seconds spent restoring host -> device.", registry=r
        )
        self.host_evictions = Counter(
            "ninfer_host_kv_evictions_total", "Host KV entries evicted, by reason.", ["reason"], registry=r
        )
        self.host_parks = Counter(
            "ninfer_host_kv_parks_total", "Sequences parked device -> host (one entry each).", registry=r
        )
        self.host_restores = Counter(
            "ninfer_host_kv_restores_total", "Host entries restored host -> device.", registry=r
        )
        self.host_park_skips = Counter(
            "ninfer_host_kv_park_skips_total",
            "Evicted device checkpoints not parked, by reason (covered: their tokens live on in longer device "
            "checkpoints; on_host: already parked).",
            ["reason"],
            registry=r,
        )
        self.host_park_refusals = Counter(
            "ninfer_host_kv_park_refusals_total",
            "Parks refused by the host cache, by reason (oversize, pinned, ...).",
            ["reason"],
            registry=r,
        )
        self.steps = Counter(
            "ninfer_engine_steps_total", "Scheduler steps (including empty ones).", registry=r
        )
        self.forward_steps = Counter(
            "ninfer_engine_forward_steps_total", "Steps that ran the model.", registry=r
        )
        self.admission_scans = Counter(
            "ninfer_scheduler_admission_scans_total", "Admission passes over the waiting queue.", registry=r
        )
        self.prefill_tokens = Counter(
            "ninfer_engine_prefill_tokens_total",
            "Prompt tokens computed by prefill (live, per step).",
            registry=r,
        )
        self.decode_tokens = Counter(
            "ninfer_engine_decode_tokens_total",
            "Tokens produced by decode steps (live, per step).",
            registry=r,
        )
        self.engine_rejected = Counter(
            "ninfer_engine_rejected_total",
            "Requests the engine refused, by reason code.",
            ["code"],
            registry=r,
        )
        # -- identity --
        self.model_info = Gauge(
            "ninfer_model_info", "The loaded model (value 1).",
            ["model_id", "served_model_id", "weights_id", "artifact_sha256", "kv_dtype", "max_context"],
            registry=r,
        )  # fmt: skip
        self.build_info = Gauge("ninfer_build_info", "The NInfer build (value 1).", ["version"], registry=r)
        self.build_info.labels(version=_version()).set(1)
        self._precreate()
        self.alias_values: dict[str, float] = {"waiting": 0.0, "running": 0.0, "kv_usage": 0.0}
        if vllm_aliases:
            self.registry.register(VllmAliases(self))

    def _precreate(self) -> None:
        for api in APIS:
            for reason in FINISH_REASONS:
                self.requests.labels(api=api, finish_reason=reason)
            for code in REJECT_CODES:
                self.requests_rejected.labels(api=api, code=code)
        for source in PROMPT_SOURCES:
            self.prompt_tokens_by_source.labels(source=source)
        for path in REUSE_PATHS:
            self.prefix_reuse_path.labels(path=path)
        for reason in HOST_EVICTION_REASONS:
            self.host_evictions.labels(reason=reason)
        for reason in HOST_PARK_SKIP_REASONS:
            self.host_park_skips.labels(reason=reason)
        for reason in HOST_PARK_REFUSAL_REASONS:
            self.host_park_refusals.labels(reason=reason)
        for code in REJECT_CODES:
            self.engine_rejected.labels(code=code)
        for pos in range(SPEC_POSITIONS):
            self.spec_accepted_per_pos.labels(position=str(pos))

    def set_model(
        self,
        *,
        model_id: str,
        served_model_id: str | None = None,
        weights_id: str = "",
        artifact_sha256: str = "",
        kv_dtype: str = "",
        max_context: int | None = None,
    ) -> None:
        """Set `ninfer_model_info` (replacing any earlier model's series)."""
        labels = {
            "model_id": model_id,
            "served_model_id": served_model_id or model_id,
            "weights_id": weights_id,
            "artifact_sha256": artifact_sha256,
            "kv_dtype": kv_dtype,
            "max_context": "" if max_context is None else str(max_context),
        }
        with self.lock:
            self.model_info.clear()
            self.model_info.labels(**labels).set(1)
            self.model_labels = labels

    def render(self) -> bytes:
        """The Prometheus text exposition (serve with `CONTENT_TYPE`)."""
        return generate_latest(self.registry)


class VllmAliases(Collector):
    """`vllm:` names of the gauges routers read (Gateway API Inference Extension, KEDA examples)."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        with m.lock:
            values = dict(m.alias_values)
            model = (m.model_labels or {}).get("served_model_id", "")
        for name, key, doc in (
            ("vllm:num_requests_waiting", "waiting", "Alias of ninfer_requests_waiting."),
            ("vllm:num_requests_running", "running", "Alias of ninfer_requests_running."),
            ("vllm:kv_cache_usage_perc", "kv_usage", "Alias of ninfer_kv_cache_usage_ratio (0..1)."),
        ):
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            family.add_metric([model], values[key])
            yield family


class SidecarMetrics:
    """`ninfer-monitor`'s own metrics: rolling aggregates over its window (default one hour)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.server_up = Gauge(
            "ninfer_monitor_server_up",
            "1 if /stats answered recently or the request log is fresh.",
            registry=r,
        )
        self.ttft = Gauge(
            "ninfer_monitor_ttft_seconds", "Rolling time-to-first-token quantiles over the window.",
            ["percentile"], registry=r,
        )  # fmt: skip
        self.queue = Gauge(
            "ninfer_monitor_queue_seconds",
            "Rolling queue-wait quantiles over the window.",
            ["percentile"],
            registry=r,
        )
        self.prefix_hit = Gauge(
            "ninfer_monitor_prefix_hit_ratio",
            "Prompt tokens reused / prompt tokens, over the window.",
            registry=r,
        )
        self.reuse_path = Gauge(
            "ninfer_monitor_prefix_reuse_path_ratio", "Share of requests by prefix reuse path, over the window.",
            ["path"], registry=r,
        )  # fmt: skip
        self.spec_accept = Gauge(
            "ninfer_monitor_spec_acceptance_ratio", "Accepted / drafted tokens over the window.", registry=r
        )
        self.decode_tps = Gauge(
            "ninfer_monitor_decode_tokens_per_second",
            "Decode throughput over the last poll interval.",
            registry=r,
        )
        self.prefill_tps = Gauge(
            "ninfer_monitor_prefill_tokens_per_second", "Prefill throughput over the last poll interval.",
            registry=r,
        )  # fmt: skip
        self.window_requests = Gauge(
            "ninfer_monitor_window_requests", "Requests seen in the window, by finish reason.",
            ["finish_reason"], registry=r,
        )  # fmt: skip
        self.log_lines = Counter(
            "ninfer_monitor_log_lines_total", "Request-log lines read (malformed ones included).", registry=r
        )
        self.log_reopens = Counter(
            "ninfer_monitor_log_reopens_total", "Times the request log was reopened (rotation or truncation).",
            ["cause"], registry=r,
        )  # fmt: skip
        self.polls = Counter(
            "ninfer_monitor_stats_polls_total",
            "Polls of the server's /stats, by result.",
            ["result"],
            registry=r,
        )
        self.gpu_util = Gauge(
            "ninfer_monitor_gpu_utilization_ratio", "GPU utilization (nvidia-smi).", ["gpu"], registry=r
        )
        self.gpu_mem_used = Gauge(
            "ninfer_monitor_gpu_memory_used_bytes", "GPU memory in use (nvidia-smi).", ["gpu"], registry=r
        )
        self.gpu_mem_total = Gauge(
            "ninfer_monitor_gpu_memory_total_bytes", "GPU memory size (nvidia-smi).", ["gpu"], registry=r
        )
        self.gpu_power = Gauge(
            "ninfer_monitor_gpu_power_watts", "GPU power draw (nvidia-smi).", ["gpu"], registry=r
        )
        self.gpu_temp = Gauge(
            "ninfer_monitor_gpu_temperature_celsius", "GPU temperature (nvidia-smi).", ["gpu"], registry=r
        )
        for p in ("50", "95", "99"):
            self.ttft.labels(percentile=p)
            self.queue.labels(percentile=p)
        for path in REUSE_PATHS:
            self.reuse_path.labels(path=path)
        for reason in FINISH_REASONS:
            self.window_requests.labels(finish_reason=reason)
        for result in ("ok", "error"):
            self.polls.labels(result=result)
        for cause in ("rotation", "truncation"):
            self.log_reopens.labels(cause=cause)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def exposed_names(registry: CollectorRegistry) -> set[str]:
    """Every sample name a registry exposes (`_total`, `_bucket`, `_sum`, `_count`, ... included)."""
    names: set[str] = set()
    for family in registry.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    return names


def _families(registries: Iterable[CollectorRegistry]) -> set[str]:
    out: set[str] = set()
    for registry in registries:
        out |= exposed_names(registry)
    return out


def defined_metric_names() -> set[str]:
    """All names NInfer itself exports (server, with vLLM aliases, and sidecar)."""
    return _families([ServerMetrics(vllm_aliases=True).registry, SidecarMetrics().registry])


def dashboard_metric_names() -> set[str]:
    """What a dashboard or alert may reference: NInfer's names plus `EXTERNAL_METRICS`."""
    return defined_metric_names() | set(EXTERNAL_METRICS)
