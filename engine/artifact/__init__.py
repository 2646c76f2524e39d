"""The `.ninfer` artifact: container format, registry of identities, conversion, migration, digests.

The tiny, scripted and demo model builders live in engine/testing. The names below are imported lazily, so
`import engine.artifact.digest` (a flag parser's need) does not load torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.artifact.container import Artifact, read_artifact, write_artifact
    from engine.artifact.errors import ArtifactError

__all__ = ["Artifact", "ArtifactError", "read_artifact", "write_artifact"]


def __getattr__(name: str) -> Any:
    if name == "ArtifactError":
        from engine.artifact.errors import ArtifactError

        return ArtifactError
    if name in __all__:
        from engine.artifact import container

        return getattr(container, name)
    raise AttributeError(f"module 'engine.artifact' has no attribute {name!r}")
