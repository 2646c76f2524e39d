"""Host -> device uploads of small per-step values without a stream sync: the one place that builds them.

Owns: `upload`, used by the runner (step inputs, index tensors: engine/runner/pending.py re-exports it) and by
the sampler (per-row parameter columns, engine/sampling.py). On CUDA, a plain `torch.tensor(list, device="cuda")`
copies from pageable host memory, which waits for the stream to drain: between overlapped steps that wait ends
the overlap. `upload` stages the values in pinned memory and copies them with `non_blocking=True` instead.
On the CPU it is the plain `torch.tensor(values, dtype=dtype)`.
Must not touch: anything but the values it is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def upload(
    values: Sequence[Any] | Sequence[Sequence[Any]], device: torch.device, dtype: torch.dtype = torch.int64
) -> torch.Tensor:
    """`values` (ints, floats or bools; nested lists for a 2-D tensor) as a `dtype` tensor on `device`,
    without waiting for the device (pinned, non-blocking)."""
    host = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    # NOTE: torch's caching host allocator keeps the pinned block until the queued copy has read it.
    return host.pin_memory().to(device, non_blocking=True)
