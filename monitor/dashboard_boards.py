"""The dashboards' content: one `Board` per file in `dashboards/` (rendered by `monitor.dashboards`)."""

from __future__ import annotations

from monitor.dashboard_kit import SEL, Board, P, Q, quantile, quantiles, rate, ratio

OVERVIEW = Board(
    "ninfer-overview.json",
    "ninfer-overview",
    "NInfer / Overview",
    "Health, traffic, latency and cache at a glance.",
    (
        P("Servers up", (Q('sum(up{job=~".*ninfer.*"})', "up"),), kind="stat"),
        P(
            "Requests / s by finish reason",
            (Q(f"sum by (finish_reason) ({rate('ninfer_requests_total')})", "{{finish_reason}}"),),
            "reqps",
        ),
        P(
            "Error and refusal ratio",
            (
                Q(
                    ratio(
                        rate("ninfer_requests_total", 'finish_reason=~"error|aborted|rejected"'),
                        rate("ninfer_requests_total"),
                    ),
                    "errors",
                ),
            ),
            "percentunit",
        ),
        P("TTFT p95", (Q(quantile("ninfer_time_to_first_token_seconds", 0.95), "p95"),), "s"),
        P(
            "Share of requests with TTFT <= 1 s (goodput proxy)",
            (
                Q(
                    ratio(
                        rate("ninfer_time_to_first_token_seconds_bucket", 'le="1.0"'),
                        rate("ninfer_time_to_first_token_seconds_count"),
                    ),
                    "ttft<=1s",
                ),
            ),
            "percentunit",
        ),
        P(
            "Running and waiting",
            (
                Q(f"sum(ninfer_requests_running{SEL})", "running"),
                Q(f"sum(ninfer_requests_waiting{SEL})", "waiting"),
            ),
        ),
        P("Device KV usage", (Q(f"max(ninfer_kv_cache_usage_ratio{SEL})", "kv usage"),), "percentunit"),
        P(
            "Generation tokens / s",
            (Q(f"sum({rate('ninfer_generation_tokens_total')})", "generated"),),
            "short",
        ),
        P(
            "Prefix-cache hit rate",
            (
                Q(
                    ratio(rate("ninfer_prefix_cache_hits_total"), rate("ninfer_prefix_cache_queries_total")),
                    "hit rate",
                ),
            ),
            "percentunit",
        ),
        P(
            "Loaded model per instance",
            (Q(f"ninfer_model_info{SEL}", "{{instance}} {{model_id}} {{weights_id}}"),),
            kind="table",
        ),
        P("Build per instance", (Q(f"ninfer_build_info{SEL}", "{{instance}} {{version}}"),), kind="table"),
    ),
)

LATENCY = Board(
    "ninfer-latency.json",
    "ninfer-latency",
    "NInfer / Latency",
    "Where a request's time goes: queue, prefill, decode; per-token latency.",
    (
        P("Time to first token", quantiles("ninfer_time_to_first_token_seconds"), "s"),
        P("Inter-token latency", quantiles("ninfer_inter_token_latency_seconds"), "s"),
        P("Time per output token (per request)", quantiles("ninfer_time_per_output_token_seconds"), "s"),
        P("End-to-end request latency", quantiles("ninfer_e2e_request_latency_seconds"), "s"),
        P("Queue wait", quantiles("ninfer_request_queue_seconds"), "s"),
        P("Prefill time", quantiles("ninfer_request_prefill_seconds"), "s"),
        P("Decode time", quantiles("ninfer_request_decode_seconds"), "s"),
        P(
            "Mean time split (queue / prefill / decode)",
            tuple(
                Q(
                    ratio(
                        rate(f"ninfer_request_{part}_seconds_sum"),
                        rate(f"ninfer_request_{part}_seconds_count"),
                    ),
                    part,
                )
                for part in ("queue", "prefill", "decode")
            ),
            "s",
        ),
        P(
            "Sidecar rolling TTFT (window)",
            (Q(f"max by (percentile) (ninfer_monitor_ttft_seconds{SEL})", "p{{percentile}}"),),
            "s",
        ),
        P(
            "Sidecar rolling queue wait (window)",
            (Q(f"max by (percentile) (ninfer_monitor_queue_seconds{SEL})", "p{{percentile}}"),),
            "s",
        ),
    ),
)

THROUGHPUT = Board(
    "ninfer-throughput.json",
    "ninfer-throughput",
    "NInfer / Throughput",
    "Requests and tokens per second; prompt and output lengths.",
    (
        P("Requests / s by API", (Q(f"sum by (api) ({rate('ninfer_requests_total')})", "{{api}}"),), "reqps"),
        P(
            "Tokens / s of finished requests",
            (
                Q(f"sum({rate('ninfer_prompt_tokens_total')})", "prompt"),
                Q(f"sum({rate('ninfer_generation_tokens_total')})", "generated"),
            ),
        ),
        P(
            "Engine tokens / s (live, per step)",
            (
                Q(f"sum({rate('ninfer_engine_prefill_tokens_total')})", "prefill computed"),
                Q(f"sum({rate('ninfer_engine_decode_tokens_total')})", "decode"),
            ),
        ),
        P(
            "Sidecar throughput (last poll)",
            (
                Q(f"sum(ninfer_monitor_decode_tokens_per_second{SEL})", "decode"),
                Q(f"sum(ninfer_monitor_prefill_tokens_per_second{SEL})", "prefill"),
            ),
        ),
        P("Prompt length per request", quantiles("ninfer_request_prompt_tokens")),
        P("Output length per request", quantiles("ninfer_request_generation_tokens")),
        P(
            "Decode tokens per forward step",
            (
                Q(
                    ratio(
                        rate("ninfer_engine_decode_tokens_total"), rate("ninfer_engine_forward_steps_total")
                    ),
                    "tokens/step",
                ),
            ),
        ),
    ),
)

CACHE = Board(
    "ninfer-cache.json",
    "ninfer-cache",
    "NInfer / KV, prefix and host cache",
    "Device KV pool, prefix reuse (device and host RAM), parking and restoring.",
    (
        P(
            "Device KV usage",
            (Q(f"max by (instance) (ninfer_kv_cache_usage_ratio{SEL})", "{{instance}}"),),
            "percentunit",
        ),
        P(
            "Device KV pages",
            (
                Q(f"sum(ninfer_kv_cache_used_pages{SEL})", "used"),
                Q(f"sum(ninfer_kv_cache_pages{SEL})", "total"),
            ),
        ),
        P(
            "Prefix-cache hit rate (tokens)",
            (
                Q(
                    ratio(rate("ninfer_prefix_cache_hits_total"), rate("ninfer_prefix_cache_queries_total")),
                    "hit rate",
                ),
            ),
            "percentunit",
        ),
        P(
            "Prompt tokens / s by source",
            (Q(f"sum by (source) ({rate('ninfer_prompt_tokens_by_source_total')})", "{{source}}"),),
        ),
        P(
            "Requests / s by reuse path",
            (Q(f"sum by (path) ({rate('ninfer_prefix_reuse_path_total')})", "{{path}}"),),
            "reqps",
        ),
        P("Prefix checkpoints held", (Q(f"sum(ninfer_prefix_cache_checkpoints{SEL})", "checkpoints"),)),
        P(
            "Host KV cache",
            (
                Q(f"sum(ninfer_host_kv_cache_used_bytes{SEL})", "used"),
                Q(f"sum(ninfer_host_kv_cache_capacity_bytes{SEL})", "capacity"),
            ),
            "bytes",
        ),
        P(
            "Park / restore bandwidth",
            (
                Q(f"sum({rate('ninfer_host_kv_park_bytes_total')})", "park (device->host)"),
                Q(f"sum({rate('ninfer_host_kv_restore_bytes_total')})", "restore (host->device)"),
            ),
            "Bps",
        ),
        P(
            "Share of time parking / restoring",
            (
                Q(f"sum({rate('ninfer_host_kv_park_seconds_total')})", "park"),
                Q(f"sum({rate('ninfer_host_kv_restore_seconds_total')})", "restore"),
            ),
            "percentunit",
        ),
        P(
            "Parks / restores per second",
            (
                Q(f"sum({rate('ninfer_host_kv_parks_total')})", "parks"),
                Q(f"sum({rate('ninfer_host_kv_restores_total')})", "restores"),
            ),
        ),
        P(
            "Host evictions / s by reason",
            (Q(f"sum by (reason) ({rate('ninfer_host_kv_evictions_total')})", "{{reason}}"),),
        ),
        P(
            "Sidecar prefix hit ratio and reuse paths (window)",
            (
                Q(f"max(ninfer_monitor_prefix_hit_ratio{SEL})", "hit ratio"),
                Q(f"max by (path) (ninfer_monitor_prefix_reuse_path_ratio{SEL})", "{{path}}"),
            ),
            "percentunit",
        ),
    ),
)

MTP = Board(
    "ninfer-mtp.json",
    "ninfer-mtp",
    "NInfer / MTP speculative decoding",
    "Draft acceptance, tokens per verify round and per-position acceptance.",
    (
        P(
            "Acceptance rate (accepted / drafted)",
            (
                Q(
                    ratio(
                        rate("ninfer_spec_decode_accepted_tokens_total"),
                        rate("ninfer_spec_decode_draft_tokens_total"),
                    ),
                    "accept",
                ),
            ),
            "percentunit",
        ),
        P(
            "Tokens per verify round (1 + accepted / drafts)",
            (
                Q(
                    f"1 + {ratio(rate('ninfer_spec_decode_accepted_tokens_total'), rate('ninfer_spec_decode_drafts_total'))}",
                    "tokens/round",
                ),
            ),
        ),
        P(
            "Acceptance by draft position",
            (
                Q(
                    f"sum by (position) ({rate('ninfer_spec_decode_accepted_tokens_per_pos_total')}) "
                    f"/ scalar(sum({rate('ninfer_spec_decode_drafts_total')}))",
                    "pos {{position}}",
                ),
            ),
            "percentunit",
        ),
        P(
            "Drafts and draft tokens / s",
            (
                Q(f"sum({rate('ninfer_spec_decode_drafts_total')})", "drafts"),
                Q(f"sum({rate('ninfer_spec_decode_draft_tokens_total')})", "draft tokens"),
            ),
        ),
        P(
            "Sidecar acceptance (window)",
            (Q(f"max(ninfer_monitor_spec_acceptance_ratio{SEL})", "accept"),),
            "percentunit",
        ),
    ),
)

SCHEDULER = Board(
    "ninfer-scheduler.json",
    "ninfer-scheduler",
    "NInfer / Scheduler",
    "Lanes, queue, steps, admission and refusals.",
    (
        P(
            "Lanes: running, waiting, capacity",
            (
                Q(f"sum(ninfer_requests_running{SEL})", "running"),
                Q(f"sum(ninfer_requests_waiting{SEL})", "waiting"),
                Q(f"sum(ninfer_scheduler_lanes{SEL})", "lanes"),
            ),
        ),
        P(
            "Lane occupancy",
            (Q(f"sum(ninfer_requests_running{SEL}) / sum(ninfer_scheduler_lanes{SEL})", "occupancy"),),
            "percentunit",
        ),
        P(
            "HTTP generation requests in flight",
            (Q(f"sum(ninfer_http_requests_in_flight{SEL})", "in flight"),),
        ),
        P(
            "Steps / s",
            (
                Q(f"sum({rate('ninfer_engine_steps_total')})", "steps"),
                Q(f"sum({rate('ninfer_engine_forward_steps_total')})", "forward steps"),
                Q(f"sum({rate('ninfer_engine_prefill_steps_total')})", "prefill steps"),
                Q(f"sum({rate('ninfer_engine_mixed_steps_total')})", "mixed steps (prefill beside decode)"),
                Q(f"sum({rate('ninfer_scheduler_admission_scans_total')})", "admission scans"),
            ),
        ),
        P(
            "Engine refusals / s by code",
            (Q(f"sum by (code) ({rate('ninfer_engine_rejected_total')})", "{{code}}"),),
        ),
        P(
            "API refusals / s by code",
            (Q(f"sum by (code) ({rate('ninfer_requests_rejected_total')})", "{{code}}"),),
        ),
        P("Queue wait p95", (Q(quantile("ninfer_request_queue_seconds", 0.95), "p95"),), "s"),
        P(
            "Requests in the sidecar window by finish reason",
            (Q(f"max by (finish_reason) (ninfer_monitor_window_requests{SEL})", "{{finish_reason}}"),),
        ),
        P(
            "Sidecar: server up, /stats polls / s",
            (
                Q(f"max(ninfer_monitor_server_up{SEL})", "up"),
                Q(f"sum by (result) ({rate('ninfer_monitor_stats_polls_total')})", "polls {{result}}"),
            ),
        ),
    ),
)

GPU = Board(
    "ninfer-gpu.json",
    "ninfer-gpu",
    "NInfer / GPU",
    "GPU utilization, memory, power and temperature: DCGM exporter, and the sidecar's nvidia-smi readings.",
    (
        P(
            "GPU utilization (DCGM)",
            (Q("avg by (Hostname, gpu) (DCGM_FI_DEV_GPU_UTIL)", "{{Hostname}} gpu{{gpu}}"),),
            "percent",
        ),
        P(
            "Memory copy utilization (DCGM)",
            (Q("avg by (Hostname, gpu) (DCGM_FI_DEV_MEM_COPY_UTIL)", "{{Hostname}} gpu{{gpu}}"),),
            "percent",
        ),
        P(
            "Framebuffer used / free (DCGM, MiB)",
            (
                Q("sum by (Hostname, gpu) (DCGM_FI_DEV_FB_USED)", "used {{gpu}}"),
                Q("sum by (Hostname, gpu) (DCGM_FI_DEV_FB_FREE)", "free {{gpu}}"),
            ),
            "decmbytes",
        ),
        P(
            "Power (DCGM)",
            (Q("sum by (Hostname, gpu) (DCGM_FI_DEV_POWER_USAGE)", "{{Hostname}} gpu{{gpu}}"),),
            "watt",
        ),
        P(
            "Temperature (DCGM)",
            (Q("max by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP)", "{{Hostname}} gpu{{gpu}}"),),
            "celsius",
        ),
        P(
            "SM clock (DCGM)",
            (Q("avg by (Hostname, gpu) (DCGM_FI_DEV_SM_CLOCK)", "{{Hostname}} gpu{{gpu}}"),),
            "hertz",
        ),
        P(
            "XID errors (DCGM)",
            (Q("max by (Hostname, gpu) (DCGM_FI_DEV_XID_ERRORS)", "{{Hostname}} gpu{{gpu}}"),),
        ),
        P(
            "Sidecar: GPU utilization (nvidia-smi)",
            (
                Q(
                    f"max by (instance, gpu) (ninfer_monitor_gpu_utilization_ratio{SEL})",
                    "{{instance}} gpu{{gpu}}",
                ),
            ),
            "percentunit",
        ),
        P(
            "Sidecar: GPU memory (nvidia-smi)",
            (
                Q(f"sum by (instance, gpu) (ninfer_monitor_gpu_memory_used_bytes{SEL})", "used gpu{{gpu}}"),
                Q(f"sum by (instance, gpu) (ninfer_monitor_gpu_memory_total_bytes{SEL})", "total gpu{{gpu}}"),
            ),
            "bytes",
        ),
        P(
            "Sidecar: power and temperature (nvidia-smi)",
            (
                Q(f"max by (instance, gpu) (ninfer_monitor_gpu_power_watts{SEL})", "W gpu{{gpu}}"),
                Q(f"max by (instance, gpu) (ninfer_monitor_gpu_temperature_celsius{SEL})", "°C gpu{{gpu}}"),
            ),
        ),
    ),
)

OPERATOR = Board(
    "ninfer-operator.json",
    "ninfer-operator",
    "NInfer / Operator",
    "Deployments the ninfer-operator manages (kube-state-metrics), scrape health and rollouts by weights.",
    (
        P(
            "Replicas: desired, available, updated, unavailable",
            (
                Q(
                    _k
                    := 'kube_deployment_spec_replicas * on (namespace, deployment) group_left() kube_deployment_labels{label_app_kubernetes_io_managed_by="ninfer-operator"}',
                    "desired {{deployment}}",
                ),
                Q(
                    _k.replace("kube_deployment_spec_replicas", "kube_deployment_status_replicas_available"),
                    "available {{deployment}}",
                ),
                Q(
                    _k.replace("kube_deployment_spec_replicas", "kube_deployment_status_replicas_updated"),
                    "updated {{deployment}}",
                ),
                Q(
                    _k.replace(
                        "kube_deployment_spec_replicas", "kube_deployment_status_replicas_unavailable"
                    ),
                    "unavailable {{deployment}}",
                ),
            ),
        ),
        P(
            "Container restarts (1 h)",
            (
                Q(
                    'sum by (namespace, pod, container) (increase(kube_pod_container_status_restarts_total{container=~"ninfer|monitor"}[1h]))',
                    "{{pod}}/{{container}}",
                ),
            ),
        ),
        P(
            "Containers ready",
            (
                Q(
                    'sum by (namespace, container) (kube_pod_container_status_ready{container=~"ninfer|monitor"})',
                    "{{namespace}}/{{container}}",
                ),
            ),
        ),
        P("Scrape targets up", (Q('sum by (job) (up{job=~".*ninfer.*"})', "{{job}}"),)),
        P(
            "Instances by weights (rollout progress)",
            (Q(f"count by (model_id, weights_id) (ninfer_model_info{SEL})", "{{model_id}} {{weights_id}}"),),
        ),
        P("Instances by build", (Q(f"count by (version) (ninfer_build_info{SEL})", "{{version}}"),)),
    ),
)

BOARDS = (OVERVIEW, LATENCY, THROUGHPUT, CACHE, MTP, SCHEDULER, GPU, OPERATOR)
