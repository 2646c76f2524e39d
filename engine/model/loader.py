"""Build a Qwen3.5-family model from an artifact (or any name -> tensor source).

The model is constructed on the meta device and its parameters are then *assigned* the source
tensors (``load_state_dict(assign=True)``): a tensor already in the target dtype and device (an
mmap view of the artifact on the CPU) becomes the parameter itself, with no copy; otherwise the one
``.to(device, dtype)`` copy is the only one. MTP weights are loaded only when ``with_mtp``.

Then the model's input projections are fused (``Qwen3_5ForCausalLM.fuse_projections``): each layer's
q/k/v (GDN in_proj_*, MLP gate/up) become one concatenated weight, a copy, and the separate
parameters (mmap views or device copies) are dropped module by module.

An artifact whose identity names a weight profile (the published quantized files, or a development model
converted to one: ``engine.artifact.profiles.profile_for``) loads through ``profile_load.load_profile_model``
instead: checked against the profile's inventory, then bound object by object (fused parents stay one layer).
Its geometry: ``config.json`` (or ``frontend/config.json``) when the file carries one, else the profile's
published geometry (the published files carry no config: their resources are ``frontend/*``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

import torch

from engine.artifact.container import ArtifactError, Directory
from engine.model.config import ModelConfig
from engine.model.qwen3_5 import Qwen3_5ForCausalLM, model_class
from engine.model.weights import collect_weights
from engine.progress import progress


class TensorSource(Protocol):
    """What the loader needs from an artifact (``engine.artifact.container.Artifact`` provides it)."""

    directory: Directory

    @property
    def model_id(self) -> str: ...

    @property
    def weights_id(self) -> str | None: ...

    def hf_config(self) -> dict[str, Any]: ...

    def resource_names(self) -> list[str]: ...

    def tensor_names(self) -> list[str]: ...

    def tensor(self, name: str) -> torch.Tensor: ...

    def raw_bytes(self, name: str) -> memoryview: ...

    def resource(self, name: str) -> bytes: ...


FRONTEND_CONFIG = "frontend/config.json"


def build_model(
    config: ModelConfig,
    tensors: Mapping[str, torch.Tensor],
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    with_mtp: bool = False,
    fuse: bool = True,
) -> Qwen3_5ForCausalLM:
    """Model from already-collected tensors (model names, see ``weights.collect_weights``), its
    projections fused unless ``fuse`` is False (tests compare the two forms)."""
    with torch.device("meta"):
        model = model_class(config)(config, with_mtp=with_mtp)
    state: dict[str, torch.Tensor] = {}
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    with progress(total, f"loading weights to {device}") as bar:
        for name, t in tensors.items():
            target = dtype if dtype is not None and t.is_floating_point() else t.dtype
            state[name] = t.to(device=device, dtype=target)
            bar.update(t.numel() * t.element_size())
    model.load_state_dict(state, strict=True, assign=True)
    del state  # the parameters are now the only holders of the device copies: fusing can free them
    model.requires_grad_(False)
    if fuse:
        model.fuse_projections()
    return model.eval()


def load_model(
    artifact: TensorSource,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    with_mtp: bool = False,
) -> Qwen3_5ForCausalLM:
    """Load the text model (plus the MTP head when ``with_mtp``) from an artifact.

    dtype None keeps the stored dtype (bf16 for a profile's quantized model). Raises WeightInventoryError on
    missing/unexpected/misshapen tensors, ArtifactError when a profile's inventory does not match, and
    ValueError on an unsupported config.
    """
    # NOTE: imported here: engine.artifact.profiles imports engine.model.config, and this package's
    # __init__ imports this module
    from engine.artifact.profiles import profile_for, vision_geometry
    from engine.model.profile_load import load_profile_model

    names = artifact.resource_names()
    config, raw = None, None
    if "config.json" in names:
        raw = artifact.hf_config()
    elif FRONTEND_CONFIG in names:  # the published layout keeps its resources under frontend/
        raw = json.loads(artifact.resource(FRONTEND_CONFIG))
    if raw is not None:
        config = ModelConfig.from_hf(raw)
    profile = profile_for(artifact.model_id, artifact.weights_id, moe=config is not None and config.is_moe)
    if profile is not None:
        if config is None:
            config = profile.published
        if config is None:
            raise ArtifactError(
                f"{artifact.model_id}/{artifact.weights_id}: no config.json and no published geometry"
            )
        # the stored tower's geometry (None: the published family's, or a file without a tower)
        stores_tower = any(t.name.startswith("vision/") for t in artifact.directory.tensors)
        vision = vision_geometry(raw) if stores_tower else None
        return load_profile_model(
            artifact, profile, config, device, dtype or torch.bfloat16, with_mtp, vision
        )
    if config is None:
        raise ArtifactError(
            f"{artifact.model_id}/{artifact.weights_id}: the artifact has no 'config.json' resource"
        )
    tensors = collect_weights(artifact.tensor_names(), artifact.tensor, config, with_mtp)
    return build_model(config, tensors, device, dtype, with_mtp)
