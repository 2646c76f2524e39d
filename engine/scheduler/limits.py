"""Request limits: the refusals at `add_request` and the length at which a request must stop.

Owns: the admission-time refusals (no room for output in `max_context`, a request that could not run
alone in an empty pool, a full queue) and the output limit: `max_tokens` (or the server default when
omitted) clamped to `max_context`. A limit above what the context leaves is clamped, never refused: the
request then finishes with `FinishKind.CONTEXT`, which each API reports as its own context / length
limit. Must not touch: pages, slots, lanes (engine/scheduler/scheduler.py, ondemand.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.config import SchedulerConfig
from engine.request import FinishKind, FinishReason, RejectCode, Request

if TYPE_CHECKING:
    from engine.scheduler.scheduler import Scheduler


def rejection(s: Scheduler, request: Request) -> FinishReason | None:
    n, max_context = request.num_prompt_tokens, s.config.max_context
    if n >= max_context:
        return FinishReason.rejected(
            RejectCode.CONTEXT_LENGTH,
            f"prompt has {n} tokens; max_context is {max_context}, which leaves no room for output",
        )
    max_num_tokens, _ = output_limit(s.config, request)
    need = s.pages.pages_for(max_num_tokens - 1)
    if need > s.pages.num_pages:
        return FinishReason.rejected(
            RejectCode.TOO_LARGE,
            f"needs {need} KV pages ({n} prompt + {max_num_tokens - n} output tokens at "
            f"{s.pages.page_size} tokens per page) but the pool has {s.pages.num_pages} pages; "
            "lower max_tokens",
        )
    # Every live request fits within max_concurrency + max_pending_requests (upstream's rule).
    capacity = s.config.max_concurrency + s.config.max_pending_requests
    if s.num_running + len(s.waiting) >= capacity:
        return FinishReason.rejected(
            RejectCode.OVERLOADED,
            f"server is full: {s.num_running} running + {len(s.waiting)} waiting requests = "
            f"{s.config.max_concurrency} lanes + {s.config.max_pending_requests} pending places",
        )
    return None


def output_limit(config: SchedulerConfig, request: Request) -> tuple[int, FinishKind]:
    """The sequence length at which `request` must stop, and which limit that is."""
    n = request.num_prompt_tokens
    max_tokens = request.sampling_params.max_tokens or config.default_max_tokens
    if n + max_tokens <= config.max_context:
        return n + max_tokens, FinishKind.LENGTH
    return config.max_context, FinishKind.CONTEXT
