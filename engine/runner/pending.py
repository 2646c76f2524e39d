"""A launched step: its sampled ids on the device, their copy to the host, and the feeds of the next step.

Owns: `Launched` (what `ModelRunner.launch` hands back and `ModelRunner.collect` turns into a
`StepResult`), `LastSampled` (the previous step's sampled ids, still on the device, by request id) and
the two transfers of overlap scheduling:
  - host -> device without a sync: step inputs go through pinned memory with `non_blocking=True`
    (`upload`); a plain `torch.tensor(..., device="cuda")` or a blocking copy waits for the stream to drain,
    which would end the overlap;
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


def upload(values: Sequence[int] | Sequence[Sequence[int]], device: torch.device) -> torch.Tensor:
    """`values` as an int64 tensor on `device`, without waiting for the device (pinned, non-blocking)."""
    host = torch.tensor(values, dtype=torch.int64)
    if device.type != "cuda":
        return host.to(device)
    # NOTE: torch's caching host allocator keeps the pinned block until the queued copy has read it.
    return host.pin_memory().to(device, non_blocking=True)


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
    dropped: set[str] = field(default_factory=set)  # requests released since launch: keep no history

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
