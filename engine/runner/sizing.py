"""`--kv-capacity auto` on CUDA: size the KV pool from what is left after everything else is allocated.

Owns: the measurement. Everything the runner allocates besides the KV pool (the GDN state slots, the
CUDA-graph pools and their input buffers, host-parking staging, the activations and kernel workspaces
of a warm-up step) is allocated for real by a probe runner with the smallest legal pool (one
`max_context` of pages); after its warm-up, what the device still has free, minus the headroom, is
what more KV pages may take. The probe is then dropped and the caller builds the real runner with
`probe pages + extra pages`. The graph page-table width is `min(num_pages, max_context pages)`, so
nothing else the probe measured grows with the pool. The caching allocator keeps the warm-up's peak
reserved, so the measured free memory already excludes the activation peak.

    device memory   | weights | states, graphs, activations peak | probe KV | free ........ | headroom |
    real pool                                                     |<-- probe KV + free - headroom -->|

Under `--gpu-memory-limit` (`memory_limit`: torch's per-process cap, which emulates a smaller card such as the
RTX 5090's 32 GiB) the same measurement runs inside the cap: free is the room the caching allocator has left
under it (`limit - memory_reserved`, never more than the device really has free), and the headroom is taken of
the cap, the emulated card's size. The reserved figure keeps the warm-up's activation peak as the free memory does.

Headroom: `GPU_HEADROOM_BYTES` (1 GiB) plus 2% of the device's memory (fragmentation, NCCL-free
launches, the allocator's rounding). Must not touch: the scheduler, page ownership.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from typing import Any

import torch

from engine.cache.kv import GPU_HEADROOM_BYTES

logger = logging.getLogger(__name__)

HEADROOM_FRACTION = 0.02  # of the device's total memory, on top of GPU_HEADROOM_BYTES


def headroom_bytes(total_bytes: int) -> int:
    return GPU_HEADROOM_BYTES + int(total_bytes * HEADROOM_FRACTION)


def free_memory(device: torch.device, memory_limit: int | None = None) -> tuple[int, int]:
    """(free bytes, the card's size) as the pool sees them: the device's own, or under `memory_limit` the room the
    caching allocator has left within the cap (at most what the device has free) and the cap."""
    free, total = torch.cuda.mem_get_info(device)
    if memory_limit is None:
        return free, total
    return min(free, memory_limit - torch.cuda.memory_reserved(device)), memory_limit


def measure_auto_pages(
    build: Callable[[int], Any], warm_up: Callable[[Any], object], *, min_pages: int, page_bytes: int,
    device: torch.device, memory_limit: int | None = None,
) -> int:  # fmt: skip
    """Pages for the real pool: build a probe runner with `min_pages`, warm it up, measure, drop it.

    `build(num_pages)` returns a runner holding every device allocation but the pool's growth;
    `warm_up(runner)` runs its first-use step shapes; `memory_limit` (bytes): measure within that cap.
    Returns >= `min_pages`."""
    torch.cuda.synchronize(device)
    before, total = free_memory(device, memory_limit)
    probe = build(min_pages)
    warm_up(probe)
    torch.cuda.synchronize(device)
    after, _ = free_memory(device, memory_limit)
    del probe
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    released, _ = free_memory(device, memory_limit)
    used = before - after  # the probe's own allocations, its pool included: the real runner needs them again
    reserve = headroom_bytes(total)
    extra = max(0, (released - used - reserve) // page_bytes)  # anything the probe left behind is excluded
    logger.info(
        "kv-capacity auto: the runner takes %.2f GiB besides the weights (state slots, graphs, a warm-up step, "
        "a %d-page probe pool); %.2f GiB free%s, %.2f GiB headroom kept: %d pages of %d bytes (%.2f GiB)",
        used / 1024**3, min_pages, released / 1024**3,
        "" if memory_limit is None else f" under the {memory_limit / 1024**3:.2f} GiB cap", reserve / 1024**3,
        min_pages + extra, page_bytes, (min_pages + extra) * page_bytes / 1024**3,
    )  # fmt: skip
    return int(min_pages + extra)
