"""The registry of artifact identities this build accepts.

An identity is the pair `(model_id, weights_id)` from a version-2 container. Published identities carry
the exact file size and SHA-256 of the official artifact; the server refuses any other pair before a single
weight is read. Development identities (`ninfer-tiny-dense/*`, `ninfer-tiny-moe/*`) accept any weights_id
and have no fixed digest: they are the demo model and the test models, built locally.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.artifact.errors import ArtifactError


@dataclass(frozen=True, slots=True)
class RegistryEntry:
    model_id: str
    weights_id: str  # "*" = any (development identities)
    file_name: str | None
    size_bytes: int | None
    sha256: str | None
    development: bool = False

    @property
    def key(self) -> str:
        return f"{self.model_id}/{self.weights_id}"


PUBLISHED: tuple[RegistryEntry, ...] = (
    RegistryEntry(
        "qwen3.6-27b",
        "groupwise-int",
        "qwen3_6_27b.ninfer",
        17_495_365_888,
        "7b51600ffd10632b9660f56085efdd9b751d79733ad32036a652234b64bebe7b",
    ),
    RegistryEntry(
        "qwen3.6-27b",
        "nvfp4",
        "qwen3_6_27b_nvfp4.ninfer",
        18_324_064_000,
        "bce5f00d066c0f20f1317bf1fdcb458264cf95837c3b1f3fbec163694627893a",
    ),
    RegistryEntry(
        "qwen3.8-27b",
        "groupwise-int",
        "qwen3_8_27b.ninfer",
        18_210_531_328,
        "eec39564993d6e9c7d5e383382a760f093465c9d163ec9a1bd6b80199514bf3e",
    ),
    RegistryEntry(
        "qwen3.8-27b",
        "nvfp4",
        "qwen3_8_27b_nvfp4.ninfer",
        21_492_695_040,
        "bb3360522a06e136e0367f5703414d26272b7285c8a6ab6194135c17dbd81b32",
    ),
    RegistryEntry(
        "qwen3.6-35b-a3b",
        "groupwise-int",
        "qwen3_6_35b_a3b.ninfer",
        22_783_246_080,
        "1fb9ea0b5b8561e49d9604115ec89e5d9f2b6f6434e32c37c57fffd480a325d2",
    ),
)
DEVELOPMENT: tuple[RegistryEntry, ...] = (
    RegistryEntry("ninfer-tiny-dense", "*", None, None, None, development=True),
    RegistryEntry("ninfer-tiny-moe", "*", None, None, None, development=True),
)
# v1 files of the published models get this weights_id when migrated to v2.
V1_WEIGHTS_ID = {"qwen3.6-27b": "groupwise-int", "qwen3.6-35b-a3b": "groupwise-int"}


def lookup(model_id: str, weights_id: str | None) -> RegistryEntry | None:
    for entry in PUBLISHED:
        if entry.model_id == model_id and entry.weights_id == weights_id:
            return entry
    for entry in DEVELOPMENT:
        if entry.model_id == model_id:
            return entry
    return None


def accepted_identities() -> list[str]:
    return [e.key for e in (*PUBLISHED, *DEVELOPMENT)]


def check_identity(
    version: int, model_id: str, weights_id: str | None, file_size: int, *, source: str
) -> RegistryEntry:
    """Refuse a container (its directory's version and identity) that is not registered, or a published one
    of the wrong size. Takes plain values: container.py calls it, and this module imports no container."""
    if version != 2:
        raise ArtifactError(
            f"{source}: container version {version} is not served; run `ninfer-artifact migrate {source}`"
        )
    entry = lookup(model_id, weights_id)
    if entry is None:
        raise ArtifactError(
            f"{source}: identity {model_id}/{weights_id} is not registered;"
            f" accepted: {', '.join(accepted_identities())}"
        )
    if entry.size_bytes is not None and entry.size_bytes != file_size:
        raise ArtifactError(
            f"{source}: {entry.key} must be {entry.size_bytes} bytes (published), but the file is {file_size}"
        )
    return entry
