"""The scheduler package: `Scheduler` (scheduler.py), its lanes (lane.py), host parking decisions
(host.py), its invariant check (integrity.py) and its stats (stats.py). The plan it emits and the result
it commits are engine/step.py's plain data, shared with the runner."""

from engine.scheduler.lane import Lane
from engine.scheduler.scheduler import Scheduler
from engine.scheduler.stats import SchedulerStats

__all__ = ["Lane", "Scheduler", "SchedulerStats"]
