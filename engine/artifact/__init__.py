"""The `.ninfer` artifact: container format, registry of identities, conversion, migration, tiny builder."""

from engine.artifact.container import Artifact, ArtifactError, read_artifact, write_artifact

__all__ = ["Artifact", "ArtifactError", "read_artifact", "write_artifact"]
