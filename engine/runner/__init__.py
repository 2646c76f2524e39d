"""The runner: executes a `StepPlan` (engine/step.py) on the model and hands back a `StepResult`.

Rooms: runner.py (`ModelRunner`: the cache tensors, the sampler seam, one step in order), inputs.py (the
eager batch and the graphs' static buffers), graphs.py (CUDA-graph decode keyed by batch size and width),
host_copies.py (host parking's copies), warmup.py (first-use step shapes). It never imports
engine.scheduler (`.importlinter`): plans come down as plain data, results go up the same way.
"""

from engine.runner.runner import (
    CPU_AUTO_KV_BYTES,
    ModelRunner,
    auto_num_pages,
    kv_bytes_per_page,
    resolve_num_pages,
)
from engine.runner.warmup import WarmupReport

__all__ = [
    "CPU_AUTO_KV_BYTES",
    "ModelRunner",
    "WarmupReport",
    "auto_num_pages",
    "kv_bytes_per_page",
    "resolve_num_pages",
]
