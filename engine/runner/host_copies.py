"""Host parking, runner half: execute a step's parks and unparks, report restores, the stats fields.

Owns: one step's copies and the restores still in flight (`HostCopies`, over one `HostCopier`). The
scheduler decides (engine/scheduler/host.py over engine/cache/host.py's `HostIndex`) and emits `HostPark`
/ `HostUnpark` lists, with the host blocks, in its plan (engine/step.py); `ModelRunner.execute` calls
`HostCopies.run` first thing each step and `finish` last. Must not touch: the host index (entries, LRU,
pins, free blocks: only the scheduler changes them; a failed restore is reported, never dropped here),
requests, page / slot ownership, the model, the scheduler.

Order inside a step (`HostCopies.run`): every park (the scheduler has already freed those page and
slot ids, and they may be handed to this step's rows or unparks), then every unpark; the compute
stream then waits for the parks only (no host block), so this step may overwrite the ids they read.

Per-request readiness: a restoring lane has no row in the step that carries its unpark, nor in any
later step until `HostCopies.finish` reports the unpark's copy event complete (`HostRestoreReport` in
the `StepResult`). Other lanes keep decoding meanwhile; a step with no rows blocks on the pending
restores instead of spinning. A restore that cannot run (`HostEntryMismatch`: the entry does not fit the
cache; any other `ValueError`: corrupt) is reported with `ok=False` and a `drop_reason`; the scheduler
drops the entry and re-plans that lane as a cold prefill. A lane released while its restore is in flight
makes the compute stream wait for that copy first (its pages may be reused at once) and is reported
done. On the CPU the copies are synchronous, so every restore is reported at the end of its own step.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from engine.cache.host import HostIndex
from engine.cache.host_blocks import HostBudget
from engine.cache.kv import ModelCache
from engine.config import CacheConfig
from engine.runner.host_copier import HostCopier, HostEntryMismatch, ParkHandle
from engine.runner.host_layout import cache_geometry
from engine.step import HostRestoreReport, HostUnpark, StepPlan

logger = logging.getLogger(__name__)


def host_budget(cache_config: CacheConfig) -> HostBudget | None:
    """The `--host-kv-cache-mib` budget (None when 0, off)."""
    if cache_config.host_kv_cache_mib == 0:
        return None
    return HostBudget.from_mib(cache_config.host_kv_cache_mib)


class HostCopies:
    """Runner side of one budget. Use: `run(cache, plan)` first thing in a step, `finish(idle)` last."""

    def __init__(self, cache: ModelCache, budget: HostBudget) -> None:
        device = cache.device
        self.copier = HostCopier(cache_geometry(cache), budget, device=device)
        if device.type == "cuda":  # pinning costs ~0.65 s per 512 MiB and must not land inside a step
            self.copier.slabs.allocate_all()
        logger.info(
            "host KV parking: %d MiB in %d blocks of %d KiB (%s)", budget.capacity_bytes >> 20, budget.num_blocks,
            budget.block_bytes // 1024, "pinned" if device.type == "cuda" else "plain",
        )  # fmt: skip
        self._pending: dict[str, tuple[HostUnpark, ParkHandle]] = {}  # request id -> restore in flight
        self._done: list[HostRestoreReport] = []

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def run(self, cache: ModelCache, plan: StepPlan) -> None:
        """Execute `plan`'s parks, then its unparks; make the current stream wait for the parks."""
        copier = self.copier
        for request_id in plan.released_request_ids:  # released mid-restore: its pages may be reused now
            pending = self._pending.pop(request_id, None)
            if pending is not None:
                pending[1].wait()
                self._done.append(HostRestoreReport(request_id, pending[0].lane, True))
        last_park: ParkHandle | None = None
        for park in plan.host_parks:
            last_park = copier.park(cache, block_ids=park.block_ids, page_ids=park.page_ids,
                                    state_slots=park.state_slots, key=park.key)  # fmt: skip
        if last_park is not None:
            last_park.wait()  # one copy stream, FIFO: the last park's event covers every earlier one
        for unpark in plan.host_unparks:
            try:
                handle = copier.unpark(
                    cache, block_ids=unpark.block_ids, entry_num_pages=unpark.entry_num_pages,
                    checkpoint_index=unpark.checkpoint_index, page_ids=unpark.page_ids,
                    state_slot=unpark.state_slot, key=unpark.key,
                )  # fmt: skip
            except ValueError as exc:  # HostEntryMismatch or a corrupt entry: the scheduler drops it
                reason = "mismatch" if isinstance(exc, HostEntryMismatch) else "corrupt"
                logger.warning("host restore of entry %r failed, prefilling cold: %s", unpark.key, exc)
                self._done.append(HostRestoreReport(unpark.request_id, unpark.lane, False, str(exc), reason))
                continue
            self._pending[unpark.request_id] = (unpark, handle)
        copier.poll()

    def finish(self, idle: bool) -> tuple[HostRestoreReport, ...]:
        """Reports for every restore now complete or failed. `idle` (the step ran no rows): block until
        every pending restore is complete, so a step with nothing else to do never spins."""
        reports, self._done = self._done, []
        for request_id, (unpark, handle) in list(self._pending.items()):
            if idle:
                handle.synchronize()
            if handle.done():
                del self._pending[request_id]
                reports.append(HostRestoreReport(request_id, unpark.lane, True))
        return tuple(reports)


def host_stat_fields(index: HostIndex | None, copies: HostCopies | None) -> dict[str, Any]:
    """The `host_kv_*` fields of `EngineStats` (what /stats, /metrics and the monitor read): the index's
    counts with the copier's seconds and allocated RAM."""
    if index is None or copies is None:
        return {}
    copies.copier.poll()
    s = dataclasses.replace(
        index.stats(),
        allocated_bytes=copies.copier.slabs.allocated_bytes,
        park_seconds=copies.copier.seconds["park"],
        restore_seconds=copies.copier.seconds["unpark"],
    )
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
