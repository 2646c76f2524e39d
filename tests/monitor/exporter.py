"""A small real exporter for the Prometheus test: `python exporter.py PORT`.

It serves `monitor.metrics.ServerMetrics` on 127.0.0.1:PORT and feeds it, every 0.1 s, through
`monitor.collect` exactly as the API does: an engine snapshot whose counters grow (gauges included) and
finished-request records of every API, with queue/prefill timings, host-cache hits and MTP counts, plus
streamed-token gaps and a refusal now and then."""

from __future__ import annotations

import sys
import time

from monitor_helpers import request_done
from prometheus_client import start_http_server

from monitor import collect
from monitor.metrics import ServerMetrics


def main() -> None:
    port = int(sys.argv[1])
    metrics = ServerMetrics(vllm_aliases=True)
    metrics.set_model(model_id="ninfer-tiny-dense", weights_id="tiny-w1", artifact_sha256="ab" * 32,
                      kv_dtype="bf16", max_context=8192)  # fmt: skip
    start_http_server(port, addr="127.0.0.1", registry=metrics.registry)
    protocols = ("chat.completions", "responses", "messages")
    engine = {"num_running": 2, "num_waiting": 1, "max_concurrency": 4, "num_pages": 128, "num_pages_used": 40,
              "num_checkpoints": 5, "num_prefill_tokens": 0, "num_decode_tokens": 0, "num_steps": 0,
              "num_forward_steps": 0, "num_admission_scans": 0, "num_requests_rejected": {"server_overloaded": 0},
              "host_kv_used_bytes": 3 << 30, "host_kv_capacity_bytes": 4 << 30, "host_kv_park_bytes": 0,
              "host_kv_park_seconds": 0.0, "host_kv_restore_bytes": 0, "host_kv_restore_seconds": 0.0,
              "host_kv_evictions": {"lru": 0, "replaced": 0, "corrupt": 0}}  # fmt: skip
    i = 0
    while True:
        i += 1
        for key, step in (("num_prefill_tokens", 900), ("num_decode_tokens", 60), ("num_steps", 12),
                          ("num_forward_steps", 10), ("num_admission_scans", 2), ("host_kv_park_bytes", 1 << 20),
                          ("host_kv_park_seconds", 0.001), ("host_kv_restore_bytes", 1 << 19),
                          ("host_kv_restore_seconds", 0.0005)):  # fmt: skip
            engine[key] += step
        engine["num_requests_rejected"] = {"server_overloaded": i // 10}
        engine["host_kv_evictions"] = {"lru": i, "replaced": i // 2, "corrupt": i // 3}
        engine["num_waiting"] = i % 3
        collect.observe_engine(metrics, dict(engine), in_flight=i % 4)
        collect.observe_request(metrics, request_done(i, protocol=protocols[i % 3]))
        collect.observe_token_gap(metrics, 0.02 * (1 + i % 3), 1 + i % 2)
        if i % 5 == 0:
            collect.observe_request(metrics, {"event": "request_rejected", "protocol": protocols[i % 3],
                                              "code": "server_overloaded"})  # fmt: skip
        time.sleep(0.1)


if __name__ == "__main__":
    main()
