"""The scheduler package: `Scheduler` (scheduler.py), its lanes (lane.py), its invariant check
(integrity.py) and the plain data it emits to the runner (output.py)."""

from engine.scheduler.lane import Lane
from engine.scheduler.output import ScheduledRequest, SchedulerOutput, SchedulerStats
from engine.scheduler.scheduler import Scheduler

__all__ = ["Lane", "ScheduledRequest", "Scheduler", "SchedulerOutput", "SchedulerStats"]
