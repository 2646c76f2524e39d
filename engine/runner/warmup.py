"""Startup warm-up: the step shapes a server meets first, run on scratch pages before any request.

Owns: the warm-up plan (`warm_up`) and its report. Must not touch: the scheduler (it runs before the
scheduler hands out any page), host parking (attached after it).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.request import SamplingParams
from engine.step import RowPlan, StepPlan

if TYPE_CHECKING:
    from engine.runner.runner import ModelRunner


@dataclass(frozen=True)
class WarmupReport:
    """What `warm_up` ran, and how long it took (compilation included)."""

    steps: int
    tokens: int
    seconds: float


@torch.inference_mode()
def warm_up(runner: ModelRunner, prefill_chunk: int) -> WarmupReport:
    """Run the step shapes a server meets first, on scratch pages and state slots, before any request.

    First use of a shape costs far more than its steady state on the GPU (Triton compiles, fla-core
    autotunes, cuBLAS and cuDNN plan): measured at the 27B geometry, a cold server's first two steps took
    ~60 s and ~30 s. The steps: one prefill chunk of up to ``prefill_chunk`` tokens alone; a varlen batch
    continuing it beside a cold 3-token sequence (shorter than the conv window); a mixed decode + prefill
    step with a sampled (non-greedy, penalized) row; a decode step (a graph replay when graphs are captured).
    Nothing outlives the call: every request resets its state slot and writes a page before reading it,
    and the step counters are restored. Call it before the scheduler hands out pages.
    """
    started = time.perf_counter()
    page = runner.page_size
    num_pages, num_slots = runner.cache.num_pages, runner.cache.num_state_slots
    # Sequence a: a first chunk + 39 tokens; b: 9 tokens in one page. Both must fit the pool.
    first = min(prefill_chunk, (num_pages - 1) * page - 39)
    if first < 1 or num_slots < 2:
        return WarmupReport(steps=0, tokens=0, seconds=0.0)
    a_pages = tuple(range(-(-(first + 39) // page)))
    b_pages = (a_pages[-1] + 1,)
    greedy = SamplingParams(temperature=0.0)
    sampled = SamplingParams(temperature=1.0, top_p=0.9, seed=0, presence_penalty=1.5)  # as the MoE preset
    vocab = runner.config.vocab_size
    tokens = torch.randint(0, vocab, (first + 39,), generator=torch.Generator().manual_seed(0)).tolist()

    def row(rid: str, ids: Sequence[int], start: int, pages: tuple[int, ...], slot: int,
            params: SamplingParams) -> RowPlan:  # fmt: skip
        return RowPlan(
            request_id=rid, lane=slot, token_ids=tuple(ids), start_pos=start, page_ids=pages, state_slot=slot,
            reset_state=start == 0, copy_state_from=None, save_state_to=None, num_sample=1,
            sampling_params=params, num_output_tokens=0,
        )  # fmt: skip

    a, b = "warmup-a", "warmup-b"
    plan = [
        [row(a, tokens[:first], 0, a_pages, 0, greedy)],
        [row(a, tokens[first : first + 37], first, a_pages, 0, greedy), row(b, tokens[:3], 0, b_pages, 1, greedy)],
        [row(a, tokens[first + 37 : first + 38], first + 37, a_pages, 0, greedy),
         row(b, tokens[3:8], 3, b_pages, 1, sampled)],
        [row(a, tokens[first + 38 : first + 39], first + 38, a_pages, 0, greedy),
         row(b, tokens[8:9], 8, b_pages, 1, sampled)],
    ]  # fmt: skip
    counters = (runner.num_steps, runner.num_graph_steps)
    for step_id, rows in enumerate(plan):
        runner.run_rows(StepPlan(step_id, tuple(rows), (), ()))
    runner.release([a, b])
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)
    runner.num_steps, runner.num_graph_steps = counters
    return WarmupReport(
        steps=len(plan), tokens=sum(r.num_tokens for rows in plan for r in rows),
        seconds=time.perf_counter() - started,
    )  # fmt: skip
