"""Host parking, runner half: build the `HostParking` budget, execute a step's parks and unparks, stats.

Owns: one step's copies and the restores still in flight (`HostCopies`). The scheduler decides
(engine/scheduler/host.py) and emits `HostPark` / `HostUnpark` lists in its plan (engine/step.py);
`ModelRunner.execute` calls `HostCopies.run` first thing each step and `finish` last. Must not touch:
requests, page / slot ownership, the model, the scheduler.

Order inside a step (`HostCopies.run`): every park (the scheduler has already freed those page and
slot ids, and they may be handed to this step's rows or unparks), then every unpark; the compute
stream then waits for the parks only (no host block), so this step may overwrite the ids they read.

Per-request readiness: a restoring lane has no row in the step that carries its unpark, nor in any
later step until `HostCopies.finish` reports the unpark's copy event complete (`HostRestoreReport`,
which the engine loop hands to `Scheduler.commit`). Other lanes keep decoding meanwhile; a step with
no rows blocks on the pending restores instead of spinning. A restore that fails (a corrupt entry or
one that does not match the cache: `ValueError` from `unpark`) drops the entry and is reported with
`ok=False`, and the scheduler re-plans that lane as a cold prefill. A lane released while its restore
is in flight makes the compute stream wait for that copy first (its pages may be reused at once).
On the CPU the copies are synchronous, so every restore is reported at the end of its own step.
"""

from __future__ import annotations

import logging
from typing import Any

from engine.cache.host import HostParking, ParkHandle
from engine.cache.host_blocks import DEFAULT_BLOCK_BYTES, MIB
from engine.cache.host_layout import CacheGeometry
from engine.config import CacheConfig
from engine.model.forward import ModelCache
from engine.step import HostRestoreReport, HostUnpark, StepPlan

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


class HostCopies:
    """Runner side of one budget. Use: `run(cache, plan)` first thing in a step, `finish(idle)` last."""

    def __init__(self, host: HostParking) -> None:
        self.host = host
        self._pending: dict[str, tuple[HostUnpark, ParkHandle]] = {}  # request id -> restore in flight
        self._failed: list[HostRestoreReport] = []

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def run(self, cache: ModelCache, plan: StepPlan) -> None:
        """Execute `plan`'s parks, then its unparks; make the current stream wait for the parks."""
        host = self.host
        for request_id in plan.released_request_ids:  # released mid-restore: its pages may be reused now
            pending = self._pending.pop(request_id, None)
            if pending is not None:
                pending[1].wait()
        last_park: ParkHandle | None = None
        for park in plan.host_parks:
            handle = host.park(park.key, cache, page_ids=park.page_ids, token_ids=park.token_ids,
                               checkpoints=park.checkpoints)  # fmt: skip
            last_park = handle or last_park
        if last_park is not None:
            last_park.wait()  # one copy stream, FIFO: the last park's event covers every earlier one
        for unpark in plan.host_unparks:
            try:
                handle = host.unpark(unpark.key, cache, page_ids=unpark.page_ids, state_slot=unpark.state_slot,
                                     num_tokens=unpark.num_tokens, keep=unpark.keep)  # fmt: skip
            except ValueError as exc:  # HostEntryMismatch (already dropped) or a corrupt entry
                if unpark.key in host:
                    host.drop(unpark.key, "corrupt")
                logger.warning("host restore of entry %r failed, prefilling cold: %s", unpark.key, exc)
                self._failed.append(HostRestoreReport(unpark.request_id, unpark.lane, False, str(exc)))
                continue
            self._pending[unpark.request_id] = (unpark, handle)
        host.poll()

    def finish(self, idle: bool) -> tuple[HostRestoreReport, ...]:
        """Reports for every restore now complete or failed. `idle` (the step ran no rows): block until
        every pending restore is complete, so a step with nothing else to do never spins."""
        reports, self._failed = self._failed, []
        for request_id, (unpark, handle) in list(self._pending.items()):
            if idle:
                handle.synchronize()
            if handle.done():
                del self._pending[request_id]
                reports.append(HostRestoreReport(request_id, unpark.lane, True))
        return tuple(reports)


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
