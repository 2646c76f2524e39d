"""The runner: executes a `StepPlan` (engine/step.py) on the model and hands back a `StepResult`.

Rooms: runner.py (`ModelRunner`: the cache tensors, the sampler seam, one step in order), inputs.py (the
eager batch and the graphs' static buffers), graphs.py (CUDA-graph decode keyed by batch size and width),
host parking's copies (host_copies.py: one step's parks / unparks and restore reports; host_copier.py:
the copy stream and events; host_layout.py: copy plans; host_slabs.py: pinned host RAM), warmup.py
(first-use step shapes). It never imports engine.scheduler (`.importlinter`): plans come down as plain
data, results go up the same way; it never changes the host index (the scheduler's), it reports.
"""

from engine.runner.runner import ModelRunner
from engine.runner.warmup import WarmupReport

__all__ = ["ModelRunner", "WarmupReport"]
