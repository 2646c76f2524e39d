"""In-place migration of a version-1 `.ninfer` file to version 2 (metadata only; payload untouched).

Steps, each checked before the next:
1. read and strictly validate the v1 prefix and directory;
2. choose the v2 identity: `model_id` from the v1 root, `weights_id` from the published mapping or the caller;
3. encode the v2 directory with the same objects (offsets and sizes) and require that it fits in the old
   metadata region, so the payload offset, and every payload byte, stays where it is;
4. save the old metadata region to `<file>.v1-metadata-backup` and fsync it;
5. write the new metadata region in place and fsync;
6. reopen and validate: version 2, the identity asked for, the same objects at the same offsets, same size;
7. on any failure after step 4, write the backup back and re-validate the restored v1 file; the backup is
   removed only after the migrated (or restored) file re-validates.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.artifact import formats
from engine.artifact.container import (
    ArtifactError,
    Directory,
    ResourceEntry,
    TensorEntry,
    encode_directory,
    read_directory,
)
from engine.artifact.registry import V1_WEIGHTS_ID

BACKUP_SUFFIX = ".v1-metadata-backup"


@dataclass(frozen=True, slots=True)
class MigrationResult:
    path: Path
    already_v2: bool
    model_id: str
    weights_id: str


def _objects_json(directory: Directory) -> list[dict[str, Any]]:
    """The directory's objects as JSON members, in offset order (what the reader validated)."""
    objects: list[dict[str, Any]] = []
    entries: list[TensorEntry | ResourceEntry] = [*directory.tensors, *directory.resources]
    for e in sorted(entries, key=lambda e: e.offset):
        if isinstance(e, TensorEntry):
            objects.append(
                {"name": e.name, "kind": "tensor", "shape": list(e.shape), "format": e.format,
                 "layout": e.layout, "offset": e.offset, "bytes": e.bytes}
            )  # fmt: skip
        else:
            objects.append(
                {"name": e.name, "kind": "resource", "encoding": formats.RAW_BYTES,
                 "offset": e.offset, "bytes": e.bytes}
            )  # fmt: skip
    return objects


def _same_objects(a: Directory, b: Directory) -> bool:
    return a.tensors == b.tensors and a.resources == b.resources and a.payload_offset == b.payload_offset


def _write_region(path: Path, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(0)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def migrate_v1_to_v2(
    path: str | os.PathLike[str],
    *,
    weights_id: str | None = None,
    after_write: Callable[[Path], None] | None = None,
) -> MigrationResult:
    """Migrate `path` in place. `after_write` runs after the in-place write, before re-validation (tests
    use it to inject a failure and prove the restore)."""
    path = Path(path)
    old = read_directory(path)
    if old.version == 2:
        assert old.weights_id is not None
        return MigrationResult(path, True, old.model_id, old.weights_id)
    weights_id = weights_id or V1_WEIGHTS_ID.get(old.model_id)
    if not weights_id:
        raise ArtifactError(
            f"{path}: v1 model_id {old.model_id!r} has no published weights_id; pass --weights-id"
        )
    new_meta = encode_directory(
        {"identity": {"model_id": old.model_id, "weights_id": weights_id}, "objects": _objects_json(old)}, 2
    )
    if len(new_meta) != old.payload_offset:
        raise ArtifactError(
            f"{path}: the v2 directory needs a payload offset of {len(new_meta)} bytes but the file's is"
            f" {old.payload_offset}; the payload cannot stay in place, nothing was changed"
        )
    file_size = path.stat().st_size
    with open(path, "rb") as f:
        old_meta = f.read(old.payload_offset)
    backup = path.with_name(path.name + BACKUP_SUFFIX)
    with open(backup, "wb") as f:
        f.write(old_meta)
        f.flush()
        os.fsync(f.fileno())
    try:
        _write_region(path, new_meta)
        if after_write is not None:
            after_write(path)
        new = read_directory(path)
        if (new.version, new.model_id, new.weights_id) != (2, old.model_id, weights_id):
            raise ArtifactError(
                f"{path}: re-read identity {new.model_id}/{new.weights_id} is not the one written"
            )
        if not _same_objects(old, new) or path.stat().st_size != file_size:
            raise ArtifactError(f"{path}: re-read objects or file size differ from the v1 file")
    except BaseException:
        _write_region(path, old_meta)
        restored = read_directory(path)
        if restored.version != 1 or not _same_objects(old, restored):
            raise ArtifactError(
                f"{path}: restore from {backup} did not re-validate; the backup is kept"
            ) from None
        backup.unlink()
        raise
    backup.unlink()
    return MigrationResult(path, False, old.model_id, weights_id)
