"""monitor.metrics and monitor.collect: names, units, buckets, and the updates engine stats and request
records turn into (checked on the rendered exposition, and by `promtool check metrics`)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field

from monitor_helpers import request_done, tool
from prometheus_client.parser import text_string_to_metric_families

from engine.cache.host import EVICTION_REASONS
from monitor import collect
from monitor.metrics import HOST_EVICTION_REASONS, ServerMetrics, SidecarMetrics, defined_metric_names

REQUIRED = """ninfer_requests_total ninfer_requests_running ninfer_requests_waiting ninfer_time_to_first_token_seconds
ninfer_inter_token_latency_seconds ninfer_time_per_output_token_seconds ninfer_e2e_request_latency_seconds
ninfer_request_queue_seconds ninfer_request_prefill_seconds ninfer_request_decode_seconds ninfer_prompt_tokens_total
ninfer_generation_tokens_total ninfer_prompt_tokens_by_source_total ninfer_prefix_cache_queries_total
ninfer_prefix_cache_hits_total ninfer_kv_cache_usage_ratio ninfer_host_kv_cache_used_bytes
ninfer_host_kv_cache_capacity_bytes ninfer_host_kv_park_bytes_total ninfer_host_kv_park_seconds_total
ninfer_host_kv_restore_bytes_total ninfer_host_kv_restore_seconds_total ninfer_host_kv_evictions_total
ninfer_host_kv_parks_total ninfer_host_kv_restores_total ninfer_host_kv_park_skips_total
ninfer_host_kv_park_refusals_total
ninfer_spec_decode_drafts_total ninfer_spec_decode_draft_tokens_total ninfer_spec_decode_accepted_tokens_total
ninfer_spec_decode_accepted_tokens_per_pos_total ninfer_model_info ninfer_build_info""".split()


@dataclass(frozen=True)
class Stats:  # the shape of engine.core.EngineStats plus the host-cache fields the engine will add
    num_running: int = 1
    num_waiting: int = 2
    max_concurrency: int = 4
    num_pages: int = 100
    num_pages_used: int = 25
    num_pages_reclaimable: int = 0
    num_checkpoints: int = 3
    num_prefill_tokens: int = 1000
    num_decode_tokens: int = 200
    num_steps: int = 50
    num_forward_steps: int = 40
    num_admission_scans: int = 7
    num_preemptions: int = 3
    num_recomputed_tokens: int = 90
    num_requests_rejected: dict[str, int] = field(default_factory=lambda: {"server_overloaded": 2})
    host_kv_used_bytes: int = 1 << 30
    host_kv_capacity_bytes: int = 4 << 30
    host_kv_park_bytes: int = 5000
    host_kv_evictions: dict[str, int] = field(default_factory=lambda: {"lru": 3})
    host_kv_parks: int = 6
    host_kv_restores: int = 2
    host_kv_park_skips: dict[str, int] = field(default_factory=lambda: {"covered": 5, "on_host": 1})
    host_kv_park_refusals: dict[str, int] = field(default_factory=lambda: {"oversize": 1})


def samples(metrics: ServerMetrics | SidecarMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_every_required_metric_is_exposed_with_prefix_and_units() -> None:
    names = defined_metric_names()
    for name in REQUIRED:
        assert name in names, name
    m = ServerMetrics()
    for family in text_string_to_metric_families(m.render().decode()):
        assert family.name.startswith("ninfer_"), family.name
        if family.type == "counter":
            assert any(s.name.endswith("_total") for s in family.samples), family.name
    bounds = [float(le) for (n, labels), _ in samples(m).items()
              if n == "ninfer_request_prefill_seconds_bucket" for k, le in labels if k == "le" and le != "+Inf"]  # fmt: skip
    assert max(bounds) >= 600, "200k-token prefills must land in a finite bucket"


def test_exposition_passes_promtool_check_metrics() -> None:
    m = ServerMetrics(vllm_aliases=True)
    m.set_model(model_id="ninfer-tiny-dense", weights_id="w1", artifact_sha256="ab" * 32, kv_dtype="bf16")
    collect.observe_engine(m, Stats())
    collect.observe_request(m, request_done(1))
    plain = ServerMetrics()
    collect.observe_engine(plain, Stats())
    collect.observe_request(plain, request_done(1))
    for metrics in (plain, SidecarMetrics()):
        done = subprocess.run(
            [tool("promtool"), "check", "metrics"], input=metrics.render(), capture_output=True
        )
        assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), done
    # the vLLM aliases keep vLLM's names: promtool's only complaint is their ':'
    done = subprocess.run([tool("promtool"), "check", "metrics"], input=m.render(), capture_output=True)
    complaints = [line for line in done.stderr.decode().splitlines() if line.strip()]
    assert complaints and all(line.startswith("vllm:") and "':'" in line for line in complaints), complaints


def test_kv_usage_counts_the_pages_requests_hold() -> None:
    """Pages only prefix checkpoints hold are free to admission (eviction reclaims them): not load, as vLLM counts
    its cached free blocks; the vLLM alias the endpoint picker reads follows."""
    m = ServerMetrics(vllm_aliases=True)
    collect.observe_engine(m, Stats(num_pages_used=100, num_pages_reclaimable=80))
    s = samples(m)
    assert (
        s[("ninfer_kv_cache_usage_ratio", ())]
        == 0.2
        == s[("vllm:kv_cache_usage_perc", (("model_name", ""),))]
    )
    assert s[("ninfer_kv_cache_used_pages", ())] == 100


def test_engine_stats_set_gauges_and_counters_count_increments_across_a_restart() -> None:
    m = ServerMetrics(vllm_aliases=True)
    collect.observe_engine(m, Stats(), in_flight=5)
    collect.observe_engine(m, Stats(num_prefill_tokens=1500, num_steps=60, host_kv_evictions={"lru": 4}))
    s = samples(m)
    assert s[("ninfer_requests_running", ())] == 1
    assert s[("ninfer_requests_waiting", ())] == 2
    assert s[("ninfer_kv_cache_usage_ratio", ())] == 0.25
    assert s[("ninfer_http_requests_in_flight", ())] == 5
    assert s[("ninfer_host_kv_cache_capacity_bytes", ())] == 4 << 30
    assert s[("ninfer_engine_prefill_tokens_total", ())] == 1500
    assert s[("ninfer_engine_steps_total", ())] == 60
    assert s[("ninfer_scheduler_preemptions_total", ())] == 3
    assert s[("ninfer_scheduler_recomputed_tokens_total", ())] == 90
    assert s[("ninfer_engine_rejected_total", (("code", "server_overloaded"),))] == 2
    assert s[("ninfer_host_kv_evictions_total", (("reason", "lru"),))] == 4
    assert s[("ninfer_host_kv_park_bytes_total", ())] == 5000
    assert s[("ninfer_host_kv_parks_total", ())] == 6 and s[("ninfer_host_kv_restores_total", ())] == 2
    assert s[("ninfer_host_kv_park_skips_total", (("reason", "covered"),))] == 5
    assert s[("ninfer_host_kv_park_skips_total", (("reason", "on_host"),))] == 1
    assert s[("ninfer_host_kv_park_refusals_total", (("reason", "oversize"),))] == 1
    assert s[("vllm:num_requests_waiting", (("model_name", ""),))] == 2
    # the engine restarted: its counters begin again at 10; the exported counter only grows
    collect.observe_engine(m, Stats(num_prefill_tokens=10))
    assert samples(m)[("ninfer_engine_prefill_tokens_total", ())] == 1510


def test_request_records_fill_latency_tokens_prefix_sources_and_spec() -> None:
    updates = collect.request_updates(request_done(1))  # pure: nothing applied yet
    assert (
        collect.Update("requests", "inc", 1, (("api", "openai_chat"), ("finish_reason", "stop"))) in updates
    )
    m = ServerMetrics()
    collect.apply(m, updates)
    collect.observe_request(
        m, {"event": "request_rejected", "protocol": "messages", "code": "context_length_exceeded"}
    )
    collect.observe_token_gap(m, 0.09, 3)
    s = samples(m)
    assert s[("ninfer_time_to_first_token_seconds_count", ())] == 1
    assert s[("ninfer_time_to_first_token_seconds_sum", ())] == 0.25
    assert s[("ninfer_request_queue_seconds_sum", ())] == 0.05
    assert abs(s[("ninfer_request_prefill_seconds_sum", ())] - 0.2) < 1e-9  # ttft - queue
    assert s[("ninfer_request_decode_seconds_sum", ())] == 1.0
    assert abs(s[("ninfer_time_per_output_token_seconds_sum", ())] - 1.05 / 49) < 1e-12
    assert s[("ninfer_inter_token_latency_seconds_count", ())] == 3
    assert s[("ninfer_prompt_tokens_total", ())] == 1000
    assert s[("ninfer_generation_tokens_total", ())] == 50
    assert s[("ninfer_prefix_cache_queries_total", ())] == 1000
    assert s[("ninfer_prefix_cache_hits_total", ())] == 256
    assert s[("ninfer_prompt_tokens_by_source_total", (("source", "computed"),))] == 744
    assert s[("ninfer_prompt_tokens_by_source_total", (("source", "device_cache"),))] == 192
    assert s[("ninfer_prompt_tokens_by_source_total", (("source", "host_cache"),))] == 64
    assert s[("ninfer_prefix_reuse_path_total", (("path", "host_restore"),))] == 1
    assert s[("ninfer_spec_decode_drafts_total", ())] == 20
    assert s[("ninfer_spec_decode_accepted_tokens_per_pos_total", (("position", "1"),))] == 10
    assert s[("ninfer_requests_total", (("api", "anthropic"), ("finish_reason", "rejected")))] == 1
    assert (
        s[("ninfer_requests_rejected_total", (("api", "anthropic"), ("code", "context_length_exceeded")))]
        == 1
    )


def test_the_api_request_log_record_as_written_today_is_understood() -> None:
    record = {"event": "request_done", "protocol": "chat.completions",
              "result": {"finish_reason": "length", "prompt_tokens": 11, "completion_tokens": 16,
                         "prefix_cache_hit_tokens": 0, "prefix_reuse_path": "none"},
              "timings_seconds": {"ttft": 0.06, "decode": 0.71, "total": 0.77}}  # fmt: skip
    m = ServerMetrics()
    collect.observe_request(m, record)
    s = samples(m)
    assert s[("ninfer_requests_total", (("api", "openai_chat"), ("finish_reason", "length")))] == 1
    assert s[("ninfer_e2e_request_latency_seconds_count", ())] == 1
    assert s[("ninfer_request_queue_seconds_count", ())] == 0  # not in the record: not invented
    assert s[("ninfer_prefix_reuse_path_total", (("path", "none"),))] == 1


def test_label_values_stay_bounded() -> None:
    m = ServerMetrics()
    collect.observe_request(
        m, {"event": "request_rejected", "protocol": "x", "code": "bad code with spaces" * 5}
    )
    assert samples(m)[("ninfer_requests_rejected_total", (("api", "x"), ("code", "other")))] == 1


def test_metric_tables_declare_each_attribute_and_name_once() -> None:
    from monitor.metrics import APIS, REJECT_CODES, SERVER_METRICS, SIDECAR_METRICS, parse_specs

    for table in (SERVER_METRICS, SIDECAR_METRICS):
        attrs, names = [s.attr for s in table], [s.name for s in table]
        assert len(set(attrs)) == len(attrs) and len(set(names)) == len(names)
        assert all(s.doc and (s.kind == "histogram") == (s.buckets is not None) for s in table)
    row = parse_specs("x counter ninfer_x_total api=APIS code=REJECT_CODES | Help.")[0]
    assert row.labels == ("api", "code") and row.precreate == (APIS, REJECT_CODES)
    try:
        parse_specs("x counter ninfer_x_total api=APIS code | Help.")
    except AssertionError as exc:
        assert "every label" in str(exc)
    else:
        raise AssertionError("a row with a value set for only some labels must be refused")


def test_host_eviction_reasons_are_the_ones_the_engine_reports() -> None:
    """The pre-created `reason` values of ninfer_host_kv_evictions_total are the engine's (they were
    capacity / superseded / expired, which it never reports: those series stayed 0 beside an unlisted `lru`)."""
    assert HOST_EVICTION_REASONS == EVICTION_REASONS
    m = ServerMetrics()
    fresh = {labels for (name, labels) in samples(m) if name == "ninfer_host_kv_evictions_total"}
    assert fresh == {(("reason", reason),) for reason in EVICTION_REASONS}
    collect.observe_engine(m, Stats(host_kv_evictions={"lru": 2, "replaced": 1}))
    s = samples(m)
    assert s[("ninfer_host_kv_evictions_total", (("reason", "lru"),))] == 2
    assert {labels for (name, labels) in s if name == "ninfer_host_kv_evictions_total"} == fresh
