"""A prompt's media: the prepared media in prompt order, where their placeholder tokens sit, their 3D positions.

``PromptMedia`` is built once per request (``prompt_media``), before admission, and rides along unchanged: the
scheduler reads only ``identity_ids`` (prefix identity) and ``splits`` (checkpoint boundaries); the runner reads
the pixels (the vision tower runs once per request), the placeholder runs (which tower rows a fed chunk splices)
and the positions. Nothing here runs a model.

Prefix identity: a placeholder token carries no content (every image of one size is the same run of
``<|image_pad|>`` ids), so the identity of a prompt is its token ids with each placeholder replaced by a negative
id derived from its medium's SHA-256 and its index in the medium. The prefix index hashes those (a repeated image
matches, a different image of the same token count never does) and no real token id is negative.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.media.image import MediaError, PreparedImage
from engine.media.positions import media_runs, mrope_positions

KINDS = ("image", "video")


@dataclass(frozen=True, eq=False)
class MediaItem:
    """One prepared medium: the tower's input rows, its patch grid, its placeholder count, its identity."""

    kind: str  # "image" | "video"
    pixel_values: torch.Tensor  # [t * h * w, patch_dim] float32, merge-block order
    grid_thw: tuple[int, int, int]
    num_tokens: int  # placeholder tokens (t * h * w / merge^2): one run per image, t runs for a video
    sha256: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"media kind {self.kind!r}: expected one of {KINDS}")

    @classmethod
    def image(cls, prepared: PreparedImage) -> MediaItem:
        return cls("image", prepared.pixel_values, prepared.grid_thw, prepared.num_tokens, prepared.sha256)


@dataclass(frozen=True, slots=True)
class MediaTokens:
    """The checkpoint's media token ids and merge size (``config.json``: ``image_token_id``, ...)."""

    image_token_id: int
    video_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int
    spatial_merge_size: int = 2


@dataclass(frozen=True, eq=False)
class PromptMedia:
    items: tuple[MediaItem, ...]  # prompt order (the order of the tower's output rows)
    runs: tuple[tuple[int, int, int], ...]  # placeholder runs: (start, end, tower row of start), prompt order
    positions: torch.Tensor  # [3, prompt length] int64 mrope positions
    rope_delta: int  # a token at index i past the media sits at i + rope_delta on all three axes
    identity_ids: tuple[int, ...]  # the prompt's ids, placeholders replaced (module docstring)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.identity_ids)

    @property
    def num_media_tokens(self) -> int:
        return sum(item.num_tokens for item in self.items)

    @property
    def sha256s(self) -> tuple[str, ...]:
        return tuple(item.sha256 for item in self.items)

    def splits(self, position: int) -> bool:
        """Whether a cut before token ``position`` falls strictly inside a placeholder run."""
        i = bisect_right(self.runs, (position, 1 << 62, 0)) - 1
        return i >= 0 and self.runs[i][0] < position < self.runs[i][1]

    def placeholders(self, start: int, end: int) -> list[tuple[int, int, int]]:
        """Placeholder tokens among positions ``[start, end)``: ``(position, tower row, count)`` pieces."""
        out = []
        for run_start, run_end, row in self.runs:
            lo, hi = max(start, run_start), min(end, run_end)
            if lo < hi:
                out.append((lo, row + lo - run_start, hi - lo))
        return out

    def last_placeholder_end(self) -> int:
        return self.runs[-1][1] if self.runs else 0


def _identity(sha256: str, index: int) -> int:
    return -(1 + (int(sha256, 16) + index) % (1 << 62))


def prompt_media(token_ids: Sequence[int], items: Sequence[MediaItem], tokens: MediaTokens) -> PromptMedia:
    """``items``: the images in prompt order and the videos in prompt order (how the two interleave is read from
    the prompt); each image is one placeholder run of its ``num_tokens``, each video ``t`` runs of
    ``num_tokens / t``. ``MediaError`` when the runs in ``token_ids`` do not match the items."""
    images = [item.grid_thw for item in items if item.kind == "image"]
    videos = [item.grid_thw for item in items if item.kind == "video"]
    try:
        positions, delta = mrope_positions(
            token_ids, images, videos, image_token_id=tokens.image_token_id,
            video_token_id=tokens.video_token_id, spatial_merge_size=tokens.spatial_merge_size,
        )  # fmt: skip
    except ValueError as exc:
        raise MediaError(f"the prompt's media placeholders do not match its media: {exc}") from exc
    found = media_runs(token_ids, tokens.image_token_id, tokens.video_token_id)
    # each run belongs to the next item of its kind (a video: its t runs in a row)
    queues: dict[int, list[tuple[MediaItem, int]]] = {1: [], 2: []}
    for item in items:
        kind = 1 if item.kind == "image" else 2
        t = 1 if kind == 1 else item.grid_thw[0]
        queues[kind].extend((item, k) for k in range(t))
    identity = list(token_ids)
    runs: list[tuple[int, int, int]] = []
    order: list[MediaItem] = []
    row = 0
    for kind, start, end in found:
        item, frame = queues[kind].pop(0)
        if frame == 0:
            order.append(item)
        per_frame = end - start
        for j in range(start, end):
            identity[j] = _identity(item.sha256, frame * per_frame + j - start)
        runs.append((start, end, row))
        row += end - start
    return PromptMedia(tuple(order), tuple(runs), positions, delta, tuple(identity))


def media_sha256(data: bytes, *extra: object) -> str:
    """A medium's identity: the SHA-256 of its bytes (and of whatever else changed what the tower sees)."""
    digest = hashlib.sha256(data)
    for value in extra:
        digest.update(repr(value).encode())
    return digest.hexdigest()
