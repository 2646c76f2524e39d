"""Loading what ``--vision`` needs from an artifact: the tower, the media token ids, the image preprocessor config.

Only with ``--vision``: without it the tower's tensors stay unread in the file (no device memory). The artifact
must be a vision-language checkpoint: a ``config.json`` with a ``vision_config`` and the ``model.visual.*``
tensors (as ``save_pretrained`` writes them); ``preprocessor_config.json`` is read when present (else
Qwen3.5's defaults). A published quantized profile stores its tower in its own layout (``vision/*``), which this
build does not bind yet: such an artifact is refused with ``--vision`` rather than served without it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.media.image import ImageProcessorConfig
from engine.media.prompt import MediaTokens
from engine.model.vision import VisionConfig, VisionTower, build_vision_tower

if TYPE_CHECKING:
    from engine.model.loader import TensorSource

PREPROCESSOR_CONFIG = "preprocessor_config.json"


@dataclass(frozen=True)
class VisionParts:
    tower: VisionTower
    tokens: MediaTokens
    processor: ImageProcessorConfig


def load_vision(artifact: TensorSource, device: torch.device | str, dtype: torch.dtype) -> VisionParts:
    """The tower (on ``device`` in ``dtype``), token ids and processor config; ``ValueError`` saying why not."""
    names = artifact.resource_names()
    if "config.json" not in names:
        raise ValueError(
            f"--vision: {artifact.model_id}/{artifact.weights_id} has no config.json with a vision_config "
            "(a published quantized profile's vision tower is not loadable by this build yet)"
        )
    raw = artifact.hf_config()
    config = VisionConfig.from_hf(raw)  # ValueError for a text-only checkpoint
    tower = build_vision_tower(config, artifact.tensor_names(), artifact.tensor, dtype).to(device)
    tokens = MediaTokens(
        image_token_id=config.image_token_id,
        video_token_id=config.video_token_id,
        vision_start_token_id=config.vision_start_token_id,
        vision_end_token_id=config.vision_end_token_id,
        spatial_merge_size=config.spatial_merge_size,
    )
    processor = ImageProcessorConfig(
        patch_size=config.patch_size,
        temporal_patch_size=config.temporal_patch_size,
        merge_size=config.spatial_merge_size,
    )
    if PREPROCESSOR_CONFIG in names:
        processor = ImageProcessorConfig.from_hf(json.loads(artifact.resource(PREPROCESSOR_CONFIG)))
    return VisionParts(tower, tokens, processor)
