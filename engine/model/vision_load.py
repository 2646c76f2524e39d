"""Loading what ``--vision`` needs from an artifact: the tower, the media token ids, the image preprocessor config.

Only with ``--vision``: without it the tower's tensors stay unread in the file (no device memory). Two layouts:

- a plain (bf16/fp32) vision-language checkpoint: a ``config.json`` with a ``vision_config`` and the
  ``model.visual.*`` tensors (as ``save_pretrained`` writes them);
- a weight profile (``engine.artifact.profiles``: the published quantized files, or a development model
  converted to one): the tower's ``vision/*`` objects, each dequantized once to the tower's dtype with the
  exact decoder (``kernels.quant``) and bound to its parameter (``hf_source.vision_parameter``). The tower's
  geometry and the media token ids come from the stored ``config.json`` (a converted file) or, in the published
  layout (no config: ``frontend/*`` resources), from the family's tower (``VisionGeometry``'s defaults) at the
  profile's published text width and the token ids of the artifact's tokenizer.

``preprocessor_config.json`` (or ``frontend/preprocessor_config.json``) is read when present, else the
processor follows the tower's patch geometry. A missing or mis-sized tower object is a ``ValueError`` naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from engine.media.image import ImageProcessorConfig
from engine.media.prompt import MediaTokens
from engine.model.config import ModelConfig
from engine.model.vision import VisionConfig, VisionTower, build_vision_tower

if TYPE_CHECKING:
    from engine.artifact.profiles import WeightProfile
    from engine.model.loader import TensorSource

PREPROCESSOR_CONFIG = "preprocessor_config.json"
MEDIA_TOKENS = {"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>",
                "vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>"}  # fmt: skip


@dataclass(frozen=True)
class VisionParts:
    tower: VisionTower
    tokens: MediaTokens
    processor: ImageProcessorConfig


def _resource(artifact: TensorSource, name: str) -> bytes | None:
    names = artifact.resource_names()
    for candidate in (name, f"frontend/{name}"):
        if candidate in names:
            return artifact.resource(candidate)
    return None


def _published_config(artifact: TensorSource, profile: WeightProfile) -> dict[str, Any]:
    """The family's tower at the published text width, with the media token ids of the artifact's tokenizer."""
    assert profile.published is not None
    raw = _resource(artifact, "tokenizer.json")
    if raw is None:
        raise ValueError(f"--vision: {profile.key} has no tokenizer.json to read the media token ids from")
    ids = {t["content"]: int(t["id"]) for t in json.loads(raw).get("added_tokens", [])}
    missing = [token for token in MEDIA_TOKENS.values() if token not in ids]
    if missing:
        raise ValueError(f"--vision: {profile.key}: the tokenizer has no {', '.join(missing)}")
    return {
        "vision_config": {"out_hidden_size": profile.published.hidden_size},
        **{key: ids[token] for key, token in MEDIA_TOKENS.items()},
    }


def build_profile_tower(
    artifact: TensorSource,
    profile: WeightProfile,
    text: ModelConfig,
    config: VisionConfig,
    device: torch.device | str,
    dtype: torch.dtype,
) -> VisionTower:
    """The tower bound from the profile's ``vision/*`` objects at ``config``'s geometry (``text``: the text
    model's geometry the profile is laid out at); ``check_inventory``'s ArtifactError (a ValueError) naming every
    object that is missing, extra, or not the profile's shape, format or layout."""
    from engine.artifact.profiles import VisionGeometry
    from engine.artifact.profiles.hf_source import vision_parameter
    from engine.model.profile_load import check_inventory, stored_value

    dev = torch.device(device)
    # the whole file against the profile with this tower (ArtifactError, a ValueError, naming the objects)
    specs = check_inventory(artifact.directory, profile, text, VisionGeometry.of(config))
    with torch.device("meta"):
        tower = VisionTower(config)
    wanted = tower.state_dict()
    state: dict[str, torch.Tensor] = {}
    for spec in specs:
        if spec.name.startswith("vision/"):
            parameter = vision_parameter(spec.name)
            value = stored_value(artifact, spec, dev)
            state[parameter] = value.reshape(wanted[parameter].shape).to(dtype)
    tower.load_state_dict(state, strict=True, assign=True)
    return tower.requires_grad_(False).eval()


def load_vision(artifact: TensorSource, device: torch.device | str, dtype: torch.dtype) -> VisionParts:
    """The tower (on ``device`` in ``dtype``), token ids and processor config; ``ValueError`` saying why not."""
    from engine.artifact.profiles import profile_for

    raw = _resource(artifact, "config.json")
    stored = json.loads(raw) if raw is not None else None
    text = ModelConfig.from_hf(stored) if isinstance(stored, dict) else None
    profile = profile_for(artifact.model_id, artifact.weights_id, moe=text is not None and text.is_moe)
    key = f"{artifact.model_id}/{artifact.weights_id}"
    if profile is not None:
        if not any(t.name.startswith("vision/") for t in artifact.directory.tensors):
            raise ValueError(f"--vision: {key} stores no vision tower (no vision/* objects)")
        if text is None and profile.published is not None:
            text, stored = profile.published, _published_config(artifact, profile)
        if text is None or not isinstance(stored, dict):
            raise ValueError(f"--vision: {key}: no config.json and no published geometry")
        config = VisionConfig.from_hf(stored)
        tower = build_profile_tower(artifact, profile, text, config, device, dtype)
    else:
        if not isinstance(stored, dict):
            raise ValueError(f"--vision: {key} has no config.json with a vision_config")
        config = VisionConfig.from_hf(stored)  # ValueError for a text-only checkpoint
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
    preprocessor = _resource(artifact, PREPROCESSOR_CONFIG)
    if preprocessor is not None:
        processor = ImageProcessorConfig.from_hf(json.loads(preprocessor))
    return VisionParts(tower, tokens, processor)
