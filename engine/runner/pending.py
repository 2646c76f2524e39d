"""A launched step: its sampled ids on the device, their copy to the host, and the feeds of the next step.

Owns: `Launched` (what `ModelRunner.launch` hands back and `ModelRunner.collect` turns into a
`StepResult`), `LastSampled` (the previous step's sampled ids, still on the device, by request id) and
the two transfers of overlap scheduling:
  - host -> device without a sync: step inputs go through pinned memory with `non_blocking=True`
    (`upload`, engine/transfer.py, re-exported here); a plain `torch.tensor(..., device="cuda")` or a blocking
    copy waits for the stream to drain, which would end the overlap;
  - device -> host without a sync: `start_copy` queues the sampled ids into pinned memory and records an
    event; `Launched.tokens()` waits on that event only when the result is needed, after the next step
    is already queued.
On the CPU every step is synchronous: the same objects, no events.
Must not touch: the model, the scheduler, requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from engine.step import PREVIOUS_TOKEN, RowPlan, StepPlan, StepResult
from engine.transfer import upload

__all__ = ["LastSampled", "Launched", "fill_previous", "previous_feeds", "start_copy", "upload"]


@dataclass
class LastSampled:
    """The ids the previous step sampled, on the device: `ids[index[request_id]]` (one per sampling row)."""

    ids: torch.Tensor  # [S] int64
    index: dict[str, int]

    @classmethod
    def of(cls, ids: torch.Tensor, rows: Sequence[RowPlan]) -> LastSampled:
        sampling = [row for row in rows if row.sample]
        assert all(row.num_sample == 1 for row in sampling), "a step fed forward samples one token per row"
        return cls(ids, {row.request_id: i for i, row in enumerate(sampling)})


def previous_feeds(rows: Sequence[RowPlan], last: LastSampled | None) -> tuple[list[int], list[int]]:
    """Where a step feeds `PREVIOUS_TOKEN`: (flat positions in the step's token ids, indices into `last.ids`)."""
    dst: list[int] = []
    src: list[int] = []
    offset = 0
    for row in rows:
        for k, token in enumerate(row.token_ids):
            if token == PREVIOUS_TOKEN:
                assert last is not None and row.request_id in last.index, (
                    f"{row.request_id}: feeds the previous step's token, which that step did not sample"
                )
                dst.append(offset + k)
                src.append(last.index[row.request_id])
        offset += row.num_tokens
    return dst, src


def fill_previous(input_ids: torch.Tensor, rows: Sequence[RowPlan], last: LastSampled | None) -> None:
    """Overwrite the `PREVIOUS_TOKEN` entries of a step's flat `input_ids` with the ids `last` sampled (on
    the device: no host sync)."""
    dst, src = previous_feeds(rows, last)
    if not dst:
        return
    assert last is not None
    index = upload([dst, src], input_ids.device)
    input_ids[index[0]] = last.ids[index[1]].to(input_ids.dtype)


@dataclass
class Launched:
    """One step queued on the device. `result` is set when it finished synchronously (host-side sampling,
    speculative steps, empty plans); else `sampled` / `sampled_cpu` / `event` hold its ids in transit."""

    plan: StepPlan
    result: StepResult | None = None
    sampled: torch.Tensor | None = None  # [S] int64 on the device, one id per sampling row
    sampled_cpu: torch.Tensor | None = None  # its host copy (pinned on CUDA), valid once `event` is done
    event: torch.cuda.Event | None = None
    # Per sampling row, in order: (its request's host output history, the index its token takes there). The
    # runner appends a `PREVIOUS_TOKEN` placeholder at launch and writes the token at collect; a request released
    # meanwhile has its list dropped by the runner, so the write lands nowhere that is read.
    history: list[tuple[list[int], int]] = field(default_factory=list)

    def reserve_history(self, histories: dict[str, list[int]]) -> None:
        """Append a placeholder for each sampling row's token to its request's history (filled by `fill_history`),
        so tokens that a later step samples through the host land after it, in step order."""
        for row in self.plan.rows:
            if row.sample:
                history = histories.setdefault(row.request_id, [])
                self.history.append((history, len(history)))
                history.append(PREVIOUS_TOKEN)

    def fill_history(self, tokens: Sequence[int]) -> None:
        """Write the sampled ids (sampling-row order) into the places `reserve_history` kept."""
        for (history, index), token in zip(self.history, tokens, strict=True):
            history[index] = token

    @property
    def in_flight(self) -> bool:
        return self.result is None

    def tokens(self) -> list[int]:
        """The sampled ids on the host, in sampling-row order (waits for this step's copy only)."""
        assert self.sampled_cpu is not None
        if self.event is not None:
            self.event.synchronize()
        return [int(t) for t in self.sampled_cpu.tolist()]


def start_copy(launched: Launched) -> None:
    """Queue the device -> host copy of `launched.sampled` and record the event that says it is done."""
    sampled = launched.sampled
    assert sampled is not None
    if sampled.device.type != "cuda":
        launched.sampled_cpu = sampled
        return
    host = torch.empty(sampled.shape, dtype=sampled.dtype, pin_memory=True)
    host.copy_(sampled, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    launched.sampled_cpu, launched.event = host, event
