"""The vocabulary of weight profiles: stored objects, profiles, and the plan of a file's layout.

A *weight profile* is the complete storage contract named by an artifact's ``(model_id, weights_id)``
identity: every object's name, shape, format and layout, in writer order, with the logical row ranges of
each fused parent (``outputs``) and the model-role each object feeds. ``plan`` lays the objects out exactly as
the container writer does (resources first, byte-aligned; tensors 256-byte aligned, sizes from
``formats.encoded_bytes``) and gives every offset and the file size without writing a byte of weights.

This module owns no model mathematics and reads no weights.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.artifact import formats
from engine.artifact.formats import PAGE_ALIGN, RAW_BYTES, TENSOR_ALIGN, align_up
from engine.model.config import ModelConfig

if TYPE_CHECKING:
    from engine.artifact.profiles.qwen3_5 import VisionGeometry

Outputs = tuple[tuple[str, int], ...]  # a fused parent's logical row ranges: (role, rows), in row order


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One stored tensor. ``outputs`` names the row ranges of a fused parent (empty: one logical matrix)."""

    name: str
    shape: tuple[int, ...]
    format: str
    outputs: Outputs = ()

    @property
    def layout(self) -> str:
        return formats.LAYOUT_OF[self.format]

    @property
    def bytes(self) -> int:
        return formats.encoded_bytes(list(self.shape), self.format, self.layout)

    @property
    def quantized(self) -> bool:
        return self.layout != formats.CONTIGUOUS


@dataclass(frozen=True, slots=True)
class ResourceSpec:
    name: str


ObjectSpec = TensorSpec | ResourceSpec


@dataclass(frozen=True, slots=True)
class WeightProfile:
    """A registered weights contract: ``build(config)`` lists its objects for a model geometry.

    ``published`` is the real geometry of the published file (None for development-only profiles);
    ``resource_bytes`` the published frontend resources' byte total, which fixes the first tensor's offset
    (the individual resource sizes are not part of the contract).
    """

    model_id: str
    weights_id: str
    build: Callable[[ModelConfig, bool, VisionGeometry | None], tuple[ObjectSpec, ...]] = field(repr=False)
    published: ModelConfig | None = field(default=None, repr=False)
    resource_bytes: int | None = None
    notes: str = ""

    @property
    def key(self) -> str:
        return f"{self.model_id}/{self.weights_id}"

    def objects(
        self, config: ModelConfig | None = None, vision: VisionGeometry | None = None
    ) -> tuple[ObjectSpec, ...]:
        """The inventory at ``config`` (default: the published geometry). At the published geometry it is the
        whole published file (its vision tower ``vision``, default the family's); at another (a development
        model converted from a checkpoint) the text tower and MTP block, plus the vision tower when ``vision``
        is given: no frontend resources, draft head or DFlash drafter."""
        geometry = config if config is not None else self.published
        if geometry is None:
            raise ValueError(f"profile {self.key}: no published geometry; pass a ModelConfig")
        return self.build(geometry, geometry == self.published, vision)


@dataclass(frozen=True, slots=True)
class PlannedObject:
    spec: ObjectSpec
    offset: int  # payload-relative
    bytes: int


@dataclass(frozen=True, slots=True)
class Plan:
    """A file's layout: every object at its payload offset, the payload offset and the file size."""

    model_id: str
    weights_id: str
    objects: tuple[PlannedObject, ...]
    json_bytes: int
    payload_offset: int

    @property
    def payload_bytes(self) -> int:
        last = self.objects[-1]
        return last.offset + last.bytes

    @property
    def file_bytes(self) -> int:
        return self.payload_offset + self.payload_bytes

    def tensor_bytes_by_format(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for obj in self.objects:
            if isinstance(obj.spec, TensorSpec):
                totals[obj.spec.format] = totals.get(obj.spec.format, 0) + obj.bytes
        return totals


def plan(
    model_id: str,
    weights_id: str,
    specs: tuple[ObjectSpec, ...],
    resource_sizes: dict[str, int] | int,
) -> Plan:
    """Lay ``specs`` out as ``container.write_artifact`` does. ``resource_sizes`` gives each resource's bytes,
    or their total (then the first resource carries it all: only the total moves the tensors' offsets, and
    the directory length differs by a few digits, far inside the 4096-byte rounding of the payload offset).
    """
    resources = [s for s in specs if isinstance(s, ResourceSpec)]
    if isinstance(resource_sizes, int):
        sizes = {r.name: (resource_sizes if i == 0 else 0) for i, r in enumerate(resources)}
    else:
        sizes = dict(resource_sizes)
    planned: list[PlannedObject] = []
    directory: list[dict[str, object]] = []
    cursor = 0
    for spec in specs:
        if isinstance(spec, ResourceSpec):
            size = sizes[spec.name]
            planned.append(PlannedObject(spec, cursor, size))
            entry: dict[str, object] = {"name": spec.name, "kind": "resource", "encoding": RAW_BYTES}
        else:
            cursor = align_up(cursor, TENSOR_ALIGN)
            size = spec.bytes
            planned.append(PlannedObject(spec, cursor, size))
            entry = {"name": spec.name, "kind": "tensor", "shape": list(spec.shape), "format": spec.format}
            entry["layout"] = spec.layout
        directory.append({**entry, "offset": cursor, "bytes": size})
        cursor += size
    root = {"identity": {"model_id": model_id, "weights_id": weights_id}, "objects": directory}
    json_bytes = len(json.dumps(root, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
    return Plan(model_id, weights_id, tuple(planned), json_bytes, align_up(16 + json_bytes, PAGE_ALIGN))


def plan_profile(profile: WeightProfile, config: ModelConfig | None = None) -> Plan:
    """The published file's plan (or, with ``config``, the plan of this profile at another geometry)."""
    if profile.resource_bytes is None:
        raise ValueError(f"profile {profile.key}: no published resource size to plan with")
    return plan(profile.model_id, profile.weights_id, profile.objects(config), profile.resource_bytes)
