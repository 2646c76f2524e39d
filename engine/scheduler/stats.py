"""SchedulerStats: the scheduler's plain numbers going up to /stats and metrics (never to the runner)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """Plain numbers for /stats and metrics (the engine never imports monitor)."""

    num_running: int
    num_waiting: int
    num_pages: int
    num_pages_used: int
    num_checkpoints: int
    num_prefix_hits: int
    num_prefix_hit_tokens: int
    num_prefill_tokens: int  # cumulative
    num_decode_tokens: int  # cumulative
    num_steps: int
    num_admission_scans: int
    num_prefill_steps: int = 0  # steps that computed prompt tokens
    num_mixed_steps: int = 0  # ... while other rows of the step decoded
    num_preemptions: int = 0  # lanes preempted for pages (engine/scheduler/ondemand.py)
    num_recomputed_tokens: int = 0  # tokens computed before a preemption that the resume computed again
    num_pages_cached: int = 0  # of num_pages_used, the distinct pages prefix checkpoints hold
    num_pages_reclaimable: int = 0  # ... of those, the pages only checkpoints hold (eviction frees them)
