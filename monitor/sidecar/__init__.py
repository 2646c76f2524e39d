"""`ninfer-monitor`: tails the request log, polls `/stats` and `nvidia-smi`, serves a dashboard and metrics."""
