"""Host parking, runner half: build the `HostParking` budget, execute a step's parks and unparks, stats.

Owns: nothing beyond one step's copies. The scheduler decides (engine/scheduler/host.py) and emits
`HostPark` / `HostUnpark` lists in its output; `ModelRunner.execute` calls `run_host_copies` first
thing each step. Must not touch: requests, page / slot ownership, the model.

Order inside a step: every park (the scheduler has already freed those page and slot ids, and they
may be handed to this step's rows or unparks), then every unpark, then the compute stream waits for
the copy stream (`wait_copies`, no host block), so the step's page copies and forward see the bytes.
On the CPU the copies are synchronous and the wait is a no-op.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from engine.cache.host import HostParking
from engine.cache.host_blocks import DEFAULT_BLOCK_BYTES, MIB
from engine.cache.host_layout import CacheGeometry
from engine.config import CacheConfig

if TYPE_CHECKING:
    from engine.model.forward import ModelCache
    from engine.scheduler import Scheduler
    from engine.scheduler.output import SchedulerOutput

logger = logging.getLogger(__name__)


def make_host_parking(cache_config: CacheConfig, cache: ModelCache) -> HostParking | None:
    """The `--host-kv-cache-mib` budget for `cache` (None when 0). On CUDA every slab is pinned now:
    pinning costs ~0.65 s per 512 MiB and must not land inside a step."""
    if cache_config.host_kv_cache_mib == 0:
        return None
    device = cache.conv_state[0].device if cache.conv_state else cache.key_cache[0].device
    mib = cache_config.host_kv_cache_mib
    host = HostParking.from_mib(
        CacheGeometry.of(cache), mib, block_bytes=host_block_bytes(mib), device=device
    )
    if device.type == "cuda":
        host.blocks.allocate_slabs()
    logger.info(
        "host KV parking: %d MiB in %d blocks of %d KiB (%s)", cache_config.host_kv_cache_mib,
        host.blocks.num_blocks, host.blocks.block_bytes // 1024, "pinned" if device.type == "cuda" else "plain",
    )  # fmt: skip
    return host


def host_block_bytes(host_kv_cache_mib: int) -> int:
    """Block size for a budget: 4 MiB, halved (down to 4 KiB) until the budget holds 256 blocks, so
    small budgets (tests, tiny models) are not lost to one partly used block per entry."""
    block = DEFAULT_BLOCK_BYTES
    while block > 4096 and host_kv_cache_mib * MIB // block < 256:
        block //= 2
    return block


def attach_host_parking(cache_config: CacheConfig, scheduler: Scheduler, runner: Any) -> HostParking | None:
    """Create the budget for the runner's cache and hand it to both halves (None when off)."""
    host = make_host_parking(cache_config, runner.cache)
    if host is not None:
        scheduler.attach_host(host)
        runner.host = host
    return host


def run_host_copies(host: HostParking | None, cache: ModelCache, output: SchedulerOutput) -> None:
    """Execute `output`'s parks, then its unparks; make the current stream wait for them."""
    if host is None:
        return
    for park in output.host_parks:
        host.park(park.key, cache, page_ids=park.page_ids, token_ids=park.token_ids,
                  checkpoints=park.checkpoints)  # fmt: skip
    for unpark in output.host_unparks:
        host.unpark(unpark.key, cache, page_ids=unpark.page_ids, state_slot=unpark.state_slot,
                    num_tokens=unpark.num_tokens, keep=unpark.keep)  # fmt: skip
    if output.host_parks or output.host_unparks:
        host.wait_copies()
    host.poll()


def host_stat_fields(host: HostParking | None) -> dict[str, Any]:
    """The `host_kv_*` fields of `EngineStats` (what /stats, /metrics and the monitor read)."""
    if host is None:
        return {}
    s = host.stats()
    return {
        "host_kv_capacity_bytes": s.capacity_bytes,
        "host_kv_used_bytes": s.used_bytes,
        "host_kv_allocated_bytes": s.allocated_bytes,
        "host_kv_entries": s.num_entries,
        "host_kv_parks": s.num_parks,
        "host_kv_restores": s.num_restores,
        "host_kv_park_bytes": s.park_bytes,
        "host_kv_restore_bytes": s.restore_bytes,
        "host_kv_park_seconds": s.park_seconds,
        "host_kv_restore_seconds": s.restore_seconds,
        "host_kv_evictions": dict(s.evictions),
        "host_kv_park_refusals": dict(s.refusals),
    }
