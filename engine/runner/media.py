"""Media rows of a step: the vision tower's output spliced at the placeholders, and the 3D (mrope) positions.

Owns: the vision tower (``--vision``) and, per request, its output rows while the request still has placeholders
to feed. The tower runs once per request, on all of its media, the first time a row feeds one of its placeholder
tokens (so a prefix hit that covers every image runs no tower at all); each prefill chunk then takes the slice of
rows for the placeholders it feeds, so a chunk may cut an image's run anywhere. The rows are dropped once the
request has fed its last placeholder (a preempted request recomputes them if it feeds placeholders again).

Positions: a row of a request with media takes the request's precomputed 3D positions for prompt tokens and
``index + rope_delta`` (the same on the three axes) past the prompt; text rows in the same batch take their
index on all three axes. A decode row past the media needs only the 1D ``index + rope_delta``, which the CUDA
graph path writes in place of the index (``DecodeRow.rope_delta``).
Must not touch: the scheduler, requests, the cache tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from engine.model.forward import ForwardBatch
from engine.model.vision import VisionTower
from engine.step import RowPlan


def feeds_media(row: RowPlan) -> bool:
    """Whether ``row`` feeds at least one placeholder token."""
    return row.media is not None and bool(row.media.placeholders(row.start_pos, row.end_pos))


def rope_delta(row: RowPlan) -> int:
    return row.media.rope_delta if row.media is not None else 0


class MediaInputs:
    """Use: ``apply(batch, rows)`` on every eager batch; ``release(ids)`` when requests end."""

    def __init__(self, tower: VisionTower | None, device: torch.device, dtype: torch.dtype) -> None:
        self.tower = tower
        self.device, self.dtype = device, dtype
        self._rows: dict[str, torch.Tensor] = {}  # request id -> tower rows [M, hidden] on the device
        self.num_tower_runs = 0
        self.num_media_tokens = 0  # placeholder rows the tower produced, over all runs

    def release(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            self._rows.pop(request_id, None)

    def apply(self, batch: ForwardBatch, rows: Sequence[RowPlan]) -> ForwardBatch:
        """``batch`` with [3, T] positions and the tower rows at its placeholder tokens, when a row has media."""
        if all(row.media is None for row in rows):
            return batch
        parts: list[torch.Tensor] = []
        embeds: list[torch.Tensor] = []
        index: list[int] = []
        offset = 0
        for row in rows:
            pos = torch.arange(row.start_pos, row.end_pos)
            media = row.media
            if media is None:
                parts.append(pos.expand(3, -1))
                offset += row.num_tokens
                continue
            p3 = (pos + media.rope_delta).expand(3, -1).clone()
            inside = pos < media.num_prompt_tokens
            if bool(inside.any()):
                p3[:, inside] = media.positions[:, pos[inside]]
            parts.append(p3)
            pieces = media.placeholders(row.start_pos, row.end_pos)
            if pieces:
                tower_rows = self._tower_rows(row)
                for position, first, count in pieces:
                    embeds.append(tower_rows[first : first + count])
                    start = offset + position - row.start_pos
                    index.extend(range(start, start + count))
                if row.end_pos >= media.last_placeholder_end():  # fed its last placeholder
                    self._rows.pop(row.request_id, None)
            offset += row.num_tokens
        positions = torch.cat(parts, dim=1).to(self.device)
        if not embeds:
            return replace(batch, positions=positions)
        mask = torch.zeros(batch.num_tokens, dtype=torch.bool)
        mask[index] = True
        return replace(
            batch, positions=positions, media_embeds=torch.cat(embeds), media_mask=mask.to(self.device)
        )

    def _tower_rows(self, row: RowPlan) -> torch.Tensor:
        found = self._rows.get(row.request_id)
        if found is not None:
            return found
        media = row.media
        assert media is not None
        if self.tower is None:
            raise RuntimeError(
                f"{row.request_id}: the prompt carries media but no vision tower is loaded (start with --vision)"
            )
        pixels = torch.cat([item.pixel_values for item in media.items]).to(self.device, self.dtype)
        grids = torch.tensor([item.grid_thw for item in media.items])
        out = self.tower(pixels, grids)
        self.num_tower_runs += 1
        self.num_media_tokens += out.shape[0]
        self._rows[row.request_id] = out
        return out
