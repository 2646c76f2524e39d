"""Observability: every Prometheus metric defined once, and the monitoring sidecar (`ninfer-monitor`)."""
