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

import itertools
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Literal, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
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
HOST_EVICTION_REASONS = ("lru", "replaced", "mismatch", "corrupt")  # engine/cache/host.py EVICTION_REASONS
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


Kind = Literal["counter", "gauge", "histogram"]
_TYPES: dict[str, type[MetricWrapperBase]] = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}
# Names a table row may use for label values (`label=SET`) and histogram buckets (`buckets=SET`).
VALUE_SETS: dict[str, tuple[str, ...]] = {
    "APIS": APIS,
    "FINISH_REASONS": FINISH_REASONS,
    "REJECT_CODES": REJECT_CODES,
    "PROMPT_SOURCES": PROMPT_SOURCES,
    "REUSE_PATHS": REUSE_PATHS,
    "HOST_EVICTION_REASONS": HOST_EVICTION_REASONS,
    "HOST_PARK_SKIP_REASONS": HOST_PARK_SKIP_REASONS,
    "HOST_PARK_REFUSAL_REASONS": HOST_PARK_REFUSAL_REASONS,
    "SPEC_POSITIONS": tuple(str(p) for p in range(SPEC_POSITIONS)),
    "PERCENTILES": ("50", "95", "99"),
    "LOG_REOPEN_CAUSES": ("rotation", "truncation"),
    "POLL_RESULTS": ("ok", "error"),
}
BUCKET_SETS: dict[str, tuple[float, ...]] = {
    "TTFT": TTFT_BUCKETS,
    "TOKEN_LATENCY": TOKEN_LATENCY_BUCKETS,
    "REQUEST_SECONDS": REQUEST_SECONDS_BUCKETS,
    "TOKEN_COUNT": TOKEN_COUNT_BUCKETS,
}


@dataclass(frozen=True, slots=True)
class Spec:
    """One metric: the attribute that holds it, its kind, name, help, labels, buckets (histograms) and
    the label values created up front (every combination, so each series exists from the first scrape)."""

    attr: str
    kind: Kind
    name: str
    doc: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None
    precreate: tuple[tuple[str, ...], ...] = ()  # one value tuple per label, or none

    def build(self, registry: CollectorRegistry) -> MetricWrapperBase:
        extra: dict[str, Any] = {} if self.buckets is None else {"buckets": self.buckets}
        metric = _TYPES[self.kind](self.name, self.doc, list(self.labels), registry=registry, **extra)
        for values in itertools.product(*self.precreate) if self.precreate else ():
            metric.labels(*values)
        return metric


def parse_specs(table: str) -> tuple[Spec, ...]:
    """Rows `ATTR KIND NAME [LABEL[=VALUE_SET] ...] [buckets=BUCKET_SET] | HELP`; blank lines and `#` skipped.
    A label with a value set has every value created up front (all labels of a row have one, or none)."""
    specs = []
    for line in table.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        head, doc = line.split(" | ", 1)
        attr, kind, name, *words = head.split()
        assert kind in _TYPES, f"{name}: unknown kind {kind!r}"
        labels, sets, buckets = [], [], None
        for word in words:
            key, _, value = word.partition("=")
            if key == "buckets":
                buckets = BUCKET_SETS[value]
                continue
            labels.append(key)
            if value:
                sets.append(VALUE_SETS[value])
        assert not sets or len(sets) == len(labels), f"{name}: give every label a value set, or none"
        specs.append(Spec(attr, cast(Kind, kind), name, doc.strip(), tuple(labels), buckets, tuple(sets)))
    return tuple(specs)


# What `ninfer-serve` serves at /metrics: requests (from each finished request's record), the engine
# snapshot (from AsyncEngine.stats(), refreshed at each scrape), identity.
SERVER_METRICS = parse_specs("""
requests                  counter   ninfer_requests_total                   api=APIS finish_reason=FINISH_REASONS | Requests that ended, by protocol and finish reason.
requests_rejected         counter   ninfer_requests_rejected_total          api=APIS code=REJECT_CODES | Requests refused before admission, by reason code.
ttft                      histogram ninfer_time_to_first_token_seconds      buckets=TTFT | Time from arrival to the first output token.
itl                       histogram ninfer_inter_token_latency_seconds      buckets=TOKEN_LATENCY | Gap between streamed tokens, per token (a chunk of k tokens counts k gaps of gap/k).
tpot                      histogram ninfer_time_per_output_token_seconds    buckets=TOKEN_LATENCY | Per request: (end-to-end - time to first token) / (output tokens - 1).
e2e                       histogram ninfer_e2e_request_latency_seconds      buckets=REQUEST_SECONDS | Time from arrival to the last token.
queue                     histogram ninfer_request_queue_seconds            buckets=REQUEST_SECONDS | Time a request waited for a lane before its prefill started.
prefill                   histogram ninfer_request_prefill_seconds          buckets=REQUEST_SECONDS | Time from admission to the first output token.
decode                    histogram ninfer_request_decode_seconds           buckets=REQUEST_SECONDS | Time from the first output token to the last.
request_prompt_tokens     histogram ninfer_request_prompt_tokens            buckets=TOKEN_COUNT | Prompt length per request (tokens).
request_generation_tokens histogram ninfer_request_generation_tokens        buckets=TOKEN_COUNT | Output length per request (tokens).
prompt_tokens             counter   ninfer_prompt_tokens_total              | Prompt tokens of finished requests (cached ones included).
generation_tokens         counter   ninfer_generation_tokens_total          | Output tokens of finished requests.
prompt_tokens_by_source   counter   ninfer_prompt_tokens_by_source_total    source=PROMPT_SOURCES | Prompt tokens by where their KV came from: computed, device prefix cache, host (RAM) cache.
prefix_queries            counter   ninfer_prefix_cache_queries_total       | Prompt tokens looked up in the prefix cache.
prefix_hits               counter   ninfer_prefix_cache_hits_total          | Prompt tokens found in the prefix cache (device or host).
prefix_reuse_path         counter   ninfer_prefix_reuse_path_total          path=REUSE_PATHS | Requests by how their prompt's prefix was reused.
spec_drafts               counter   ninfer_spec_decode_drafts_total         | Speculative verify rounds (one draft each).
spec_draft_tokens         counter   ninfer_spec_decode_draft_tokens_total   | Draft tokens proposed.
spec_accepted_tokens      counter   ninfer_spec_decode_accepted_tokens_total | Draft tokens accepted.
spec_accepted_per_pos     counter   ninfer_spec_decode_accepted_tokens_per_pos_total position=SPEC_POSITIONS | Draft tokens accepted at each draft position.
request_log_write_errors  counter   ninfer_request_log_write_errors_total   | Request-log lines that could not be written (disk full, file-size limit, ...); serving goes on.
# engine snapshot
running                   gauge     ninfer_requests_running                 | Requests holding a lane.
waiting                   gauge     ninfer_requests_waiting                 | Requests queued for a lane.
in_flight                 gauge     ninfer_http_requests_in_flight          | HTTP generation requests open.
lanes                     gauge     ninfer_scheduler_lanes                  | Lanes (--max-concurrency).
kv_usage                  gauge     ninfer_kv_cache_usage_ratio             | Fraction of device KV pages requests hold (pages only prefix checkpoints hold count as free: eviction reclaims them).
kv_pages                  gauge     ninfer_kv_cache_pages                   | Device KV pages in the pool.
kv_pages_used             gauge     ninfer_kv_cache_used_pages              | Device KV pages in use.
kv_pages_cached           gauge     ninfer_kv_cache_cached_pages            | Of the KV pages in use, those prefix checkpoints hold (all of them when idle).
checkpoints               gauge     ninfer_prefix_cache_checkpoints         | Prefix checkpoints held in the device cache.
host_used                 gauge     ninfer_host_kv_cache_used_bytes         | Host (RAM) KV cache bytes in use.
host_capacity             gauge     ninfer_host_kv_cache_capacity_bytes     | Host (RAM) KV cache capacity (--host-kv-cache-mib).
host_park_bytes           counter   ninfer_host_kv_park_bytes_total         | Bytes copied device -> host when parking.
host_park_seconds         counter   ninfer_host_kv_park_seconds_total       | Seconds spent parking device -> host.
host_restore_bytes        counter   ninfer_host_kv_restore_bytes_total      | Bytes copied host -> device when restoring.
host_restore_seconds      counter   ninfer_host_kv_restore_seconds_total    | Seconds spent restoring host -> device.
host_evictions            counter   ninfer_host_kv_evictions_total          reason=HOST_EVICTION_REASONS | Host KV entries evicted, by reason.
host_parks                counter   ninfer_host_kv_parks_total              | Sequences parked device -> host (one entry each).
host_restores             counter   ninfer_host_kv_restores_total           | Host entries restored host -> device.
host_park_skips           counter   ninfer_host_kv_park_skips_total         reason=HOST_PARK_SKIP_REASONS | Evicted device checkpoints not parked, by reason (covered: their tokens live on in longer device checkpoints; on_host: already parked).
host_park_refusals        counter   ninfer_host_kv_park_refusals_total      reason=HOST_PARK_REFUSAL_REASONS | Parks refused by the host cache, by reason (oversize, pinned, ...).
steps                     counter   ninfer_engine_steps_total               | Scheduler steps (including empty ones).
forward_steps             counter   ninfer_engine_forward_steps_total       | Steps that ran the model.
prefill_steps             counter   ninfer_engine_prefill_steps_total       | Steps that computed prompt tokens (a burst admitted together is one).
mixed_steps               counter   ninfer_engine_mixed_steps_total         | Steps that computed prompt tokens while other rows decoded.
burst_holds               counter   ninfer_engine_burst_holds_total         | Times an idle engine held its first step for announced requests (--burst-wait-ms).
burst_timeouts            counter   ninfer_engine_burst_hold_timeouts_total | Burst holds that reached --burst-wait-ms with announced requests still in preparation.
admission_scans           counter   ninfer_scheduler_admission_scans_total  | Admission passes over the waiting queue.
preemptions               counter   ninfer_scheduler_preemptions_total      | Lanes preempted because the KV pool ran short (resumed later with the same output).
recomputed_tokens         counter   ninfer_scheduler_recomputed_tokens_total | Tokens computed before a preemption that its resume computed again.
prefill_tokens            counter   ninfer_engine_prefill_tokens_total      | Prompt tokens computed by prefill (live, per step).
decode_tokens             counter   ninfer_engine_decode_tokens_total       | Tokens produced by decode steps (live, per step).
engine_rejected           counter   ninfer_engine_rejected_total            code=REJECT_CODES | Requests the engine refused, by reason code.
# identity
model_info                gauge     ninfer_model_info                       model_id served_model_id weights_id artifact_sha256 kv_dtype max_context | The loaded model (value 1).
build_info                gauge     ninfer_build_info                       version | The NInfer build (value 1).
""")  # fmt: skip

# What `ninfer-monitor` serves at /metrics: rolling aggregates over its window, and the host's GPUs.
SIDECAR_METRICS = parse_specs("""
server_up                 gauge     ninfer_monitor_server_up                | 1 if /stats answered recently or the request log is fresh.
ttft                      gauge     ninfer_monitor_ttft_seconds             percentile=PERCENTILES | Rolling time-to-first-token quantiles over the window.
queue                     gauge     ninfer_monitor_queue_seconds            percentile=PERCENTILES | Rolling queue-wait quantiles over the window.
prefix_hit                gauge     ninfer_monitor_prefix_hit_ratio         | Prompt tokens reused / prompt tokens, over the window.
reuse_path                gauge     ninfer_monitor_prefix_reuse_path_ratio  path=REUSE_PATHS | Share of requests by prefix reuse path, over the window.
spec_accept               gauge     ninfer_monitor_spec_acceptance_ratio    | Accepted / drafted tokens over the window.
decode_tps                gauge     ninfer_monitor_decode_tokens_per_second | Decode throughput over the last poll interval.
prefill_tps               gauge     ninfer_monitor_prefill_tokens_per_second | Prefill throughput over the last poll interval.
window_requests           gauge     ninfer_monitor_window_requests          finish_reason=FINISH_REASONS | Requests seen in the window, by finish reason.
log_lines                 counter   ninfer_monitor_log_lines_total          | Request-log lines read (malformed ones included).
log_reopens               counter   ninfer_monitor_log_reopens_total        cause=LOG_REOPEN_CAUSES | Times the request log was reopened (rotation or truncation).
polls                     counter   ninfer_monitor_stats_polls_total        result=POLL_RESULTS | Polls of the server's /stats, by result.
gpu_util                  gauge     ninfer_monitor_gpu_utilization_ratio    gpu | GPU utilization (nvidia-smi).
gpu_mem_used              gauge     ninfer_monitor_gpu_memory_used_bytes    gpu | GPU memory in use (nvidia-smi).
gpu_mem_total             gauge     ninfer_monitor_gpu_memory_total_bytes   gpu | GPU memory size (nvidia-smi).
gpu_power                 gauge     ninfer_monitor_gpu_power_watts          gpu | GPU power draw (nvidia-smi).
gpu_temp                  gauge     ninfer_monitor_gpu_temperature_celsius  gpu | GPU temperature (nvidia-smi).
""")  # fmt: skip


class MetricSet:
    """The metrics of a table on one registry, each an attribute named by its `Spec.attr`."""

    SPECS: tuple[Spec, ...] = ()

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        for spec in self.SPECS:
            setattr(self, spec.attr, spec.build(self.registry))

    def __getattr__(self, name: str) -> Any:  # the table's attributes are set in __init__; typed for mypy
        raise AttributeError(f"{type(self).__name__} has no metric {name!r}")

    def render(self) -> bytes:
        """The Prometheus text exposition (serve with `CONTENT_TYPE`)."""
        return generate_latest(self.registry)


class ServerMetrics(MetricSet):
    """The server's metrics (`SERVER_METRICS`). `monitor.collect` computes the updates; `render()` exposes."""

    SPECS = SERVER_METRICS

    def __init__(self, registry: CollectorRegistry | None = None, *, vllm_aliases: bool = False) -> None:
        super().__init__(registry)
        self.lock = threading.Lock()  # guards `previous` and the alias values (scrapes run concurrently)
        self.previous: object | None = None  # the last engine stats seen (monitor.collect computes deltas)
        self.model_labels: dict[str, str] | None = None
        self.build_info.labels(version=_version()).set(1)
        self.alias_values: dict[str, float] = {"waiting": 0.0, "running": 0.0, "kv_usage": 0.0}
        if vllm_aliases:
            self.registry.register(VllmAliases(self))

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


class SidecarMetrics(MetricSet):
    """`ninfer-monitor`'s own metrics (`SIDECAR_METRICS`): rolling aggregates over its window (default one
    hour)."""

    SPECS = SIDECAR_METRICS


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
