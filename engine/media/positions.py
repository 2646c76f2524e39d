"""3D (temporal, height, width) rotary positions of a prompt holding image / video placeholder tokens.

Qwen3.5's text attention rotates by three position streams (interleaved mrope sections). Text tokens carry
the same index on all three. A run of placeholder tokens for one image (or one video frame: the processor
puts each frame between its own timestamp and vision start/end tokens) of ``h x w`` merged cells, starting
where the text would have been at position ``p``, gets ``(p, p + row, p + column)``; the text after it
resumes at ``p + max(h, w)``. A video's frames are each such a run with temporal extent 1.

So positions run behind the token index once media appear: ``rope_delta = max position + 1 - prompt
length`` (zero or negative), and every later token (the rest of the prompt past a chunk, each decoded
token) at index ``i`` sits at ``i + rope_delta`` on all three streams. Pure functions on token lists.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def media_runs(
    token_ids: Sequence[int], image_token_id: int, video_token_id: int
) -> list[tuple[int, int, int]]:
    """Maximal runs of placeholder tokens: ``(kind, start, end)`` with kind 1 image, 2 video."""
    runs: list[tuple[int, int, int]] = []
    kinds = {image_token_id: 1, video_token_id: 2}
    i, n = 0, len(token_ids)
    while i < n:
        kind = kinds.get(token_ids[i])
        if kind is None:
            i += 1
            continue
        j = i
        while j < n and token_ids[j] == token_ids[i]:
            j += 1
        runs.append((kind, i, j))
        i = j
    return runs


def mrope_positions(
    token_ids: Sequence[int],
    image_grid_thw: Sequence[Sequence[int]] | torch.Tensor | None,
    video_grid_thw: Sequence[Sequence[int]] | torch.Tensor | None,
    *,
    image_token_id: int,
    video_token_id: int,
    spatial_merge_size: int,
) -> tuple[torch.Tensor, int]:
    """Positions [3, len(token_ids)] (int64) and the rope delta for the tokens after them.

    ``image_grid_thw`` / ``video_grid_thw``: each medium's patch grid, in prompt order (the vision tower's
    grids, before the spatial merge). Each placeholder run must cover exactly one image, or one frame of a
    video; a mismatch (a run of the wrong length, too few or too many grids) raises ``ValueError``."""
    merge = spatial_merge_size
    frames: dict[int, list[tuple[int, int]]] = {1: [], 2: []}
    for kind, grids in ((1, image_grid_thw), (2, video_grid_thw)):
        for t, h, w in [] if grids is None else [tuple(int(v) for v in g) for g in grids]:
            if kind == 1 and t != 1:
                raise ValueError(f"image grid ({t}, {h}, {w}) has temporal extent {t}, expected 1")
            if h % merge or w % merge:
                raise ValueError(f"grid ({t}, {h}, {w}) is not a multiple of the spatial merge size {merge}")
            frames[kind].extend([(h // merge, w // merge)] * t)  # a video is one run per frame
    used = {1: 0, 2: 0}
    parts: list[torch.Tensor] = []
    pos = 0
    cursor = 0
    for kind, start, end in media_runs(token_ids, image_token_id, video_token_id):
        if start > cursor:
            parts.append(torch.arange(pos, pos + start - cursor).expand(3, -1))
            pos += start - cursor
        name = "image" if kind == 1 else "video frame"
        if used[kind] >= len(frames[kind]):
            raise ValueError(f"more {name} placeholder runs in the prompt than {name}s given")
        h, w = frames[kind][used[kind]]
        used[kind] += 1
        if end - start != h * w:
            raise ValueError(
                f"{name} placeholder run at {start} has {end - start} tokens, its grid needs {h * w}"
            )
        rows = torch.arange(h).repeat_interleave(w)
        cols = torch.arange(w).repeat(h)
        parts.append(torch.stack([torch.zeros(h * w, dtype=torch.long), rows, cols]) + pos)
        pos += max(h, w)
        cursor = end
    for kind, name in ((1, "image"), (2, "video frame")):
        if used[kind] != len(frames[kind]):
            raise ValueError(
                f"{len(frames[kind])} {name}s given but {used[kind]} placeholder runs in the prompt"
            )
    if len(token_ids) > cursor:
        parts.append(torch.arange(pos, pos + len(token_ids) - cursor).expand(3, -1))
    positions = torch.cat(parts, dim=1) if parts else torch.zeros(3, 0, dtype=torch.long)
    delta = int(positions.max()) + 1 - len(token_ids) if len(token_ids) else 0
    return positions, delta


def positions_after(start: int, count: int, rope_delta: int) -> torch.Tensor:
    """Positions [3, count] of the tokens at indices ``start .. start + count - 1`` past the media (decode)."""
    return torch.arange(start + rope_delta, start + rope_delta + count).expand(3, -1).clone()
