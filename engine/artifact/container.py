"""The `.ninfer` container: strict reader (memory-mapped) and writer, versions 1 and 2.

File layout (both versions)::

    [0, 8)            magic  b"NINFER\\0\\2" (v2) or b"NINFER\\0\\1" (v1)
    [8, 16)           u64 little-endian length of the JSON directory
    [16, 16+len)      UTF-8 JSON directory
    [.., payload)     zero padding up to payload_offset = align_up(16 + len, 4096)
    [payload, EOF)    objects at payload-relative offsets, in offset order

JSON root, v2: exactly ``{"identity": {"model_id", "weights_id"}, "objects": [...]}``;
v1: exactly ``{"model_id", "objects"}``. Tensor objects have exactly
``name, kind="tensor", shape, format, layout, offset, bytes``; resource objects exactly
``name, kind="resource", encoding="raw-bytes-v1", offset, bytes``. Member sets are closed: an unknown,
missing or null member is refused, and so is a misaligned, overlapping, out-of-order or truncated object, or
a `bytes` that does not match the shape, format and layout. Every error names the object.

This module knows nothing about models: it maps bytes to named tensors and resources.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.artifact import formats
from engine.artifact.errors import ArtifactError
from engine.artifact.formats import PAGE_ALIGN, RAW_BYTES, align_up
from engine.artifact.registry import check_identity
from engine.progress import progress

MAGIC_V1 = b"NINFER\x00\x01"
MAGIC_V2 = b"NINFER\x00\x02"
PREFIX_BYTES = 16
MAX_JSON_BYTES = 256 * 1024 * 1024

_TENSOR_MEMBERS = frozenset({"name", "kind", "shape", "format", "layout", "offset", "bytes"})
_RESOURCE_MEMBERS = frozenset({"name", "kind", "encoding", "offset", "bytes"})


@dataclass(frozen=True, slots=True)
class TensorEntry:
    name: str
    shape: tuple[int, ...]
    format: str
    layout: str
    offset: int  # payload-relative
    bytes: int


@dataclass(frozen=True, slots=True)
class ResourceEntry:
    name: str
    offset: int  # payload-relative
    bytes: int


@dataclass(frozen=True, slots=True)
class Directory:
    """The parsed, validated JSON directory of a container."""

    version: int
    model_id: str
    weights_id: str | None  # None for v1 files
    tensors: tuple[TensorEntry, ...]
    resources: tuple[ResourceEntry, ...]
    json_bytes: int
    payload_offset: int

    @property
    def payload_bytes(self) -> int:
        entries: tuple[TensorEntry | ResourceEntry, ...] = (*self.tensors, *self.resources)
        ends = [e.offset + e.bytes for e in entries]
        return max(ends, default=0)


# ---------------------------------------------------------------------------------------------- parsing


def _exact_members(obj: Any, expected: frozenset[str], where: str) -> None:
    if not isinstance(obj, dict):
        raise ArtifactError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    keys = set(obj)
    if unknown := sorted(keys - expected):
        raise ArtifactError(f"{where}: unknown member(s) {unknown}")
    if missing := sorted(expected - keys):
        raise ArtifactError(f"{where}: missing member(s) {missing}")
    if nulls := sorted(k for k, v in obj.items() if v is None):
        raise ArtifactError(f"{where}: null member(s) {nulls}")


def _nonempty_str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ArtifactError(f"{where}: must be a nonempty string, got {value!r}")
    return value


def _nonneg_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ArtifactError(f"{where}: must be a non-negative integer, got {value!r}")
    return value


def _parse_tensor(obj: dict[str, Any], where: str) -> TensorEntry:
    _exact_members(obj, _TENSOR_MEMBERS, where)
    shape = obj["shape"]
    if not isinstance(shape, list) or any(
        isinstance(d, bool) or not isinstance(d, int) or d <= 0 for d in shape
    ):
        raise ArtifactError(f"{where}: shape must be a list of positive integers, got {shape!r}")
    fmt, layout = obj["format"], obj["layout"]
    if fmt not in formats.FORMATS:
        raise ArtifactError(f"{where}: unknown format {fmt!r} (known: {sorted(formats.FORMATS)})")
    if layout not in formats.LAYOUTS:
        raise ArtifactError(f"{where}: unknown layout {layout!r} (known: {sorted(formats.LAYOUTS)})")
    try:
        expected = formats.encoded_bytes(shape, fmt, layout)
    except ValueError as exc:
        raise ArtifactError(f"{where}: {exc}") from None
    size = _nonneg_int(obj["bytes"], f"{where}.bytes")
    if size != expected:
        raise ArtifactError(
            f"{where}: bytes is {size} but shape {shape} in {fmt}/{layout} needs {expected} bytes"
        )
    offset = _nonneg_int(obj["offset"], f"{where}.offset")
    align = formats.tensor_alignment(layout)
    if offset % align:
        raise ArtifactError(f"{where}: offset {offset} is not {align}-byte aligned")
    return TensorEntry(obj["name"], tuple(shape), fmt, layout, offset, size)


def _parse_resource(obj: dict[str, Any], where: str) -> ResourceEntry:
    _exact_members(obj, _RESOURCE_MEMBERS, where)
    if obj["encoding"] != RAW_BYTES:
        raise ArtifactError(f"{where}: unknown resource encoding {obj['encoding']!r} (known: {RAW_BYTES!r})")
    offset = _nonneg_int(obj["offset"], f"{where}.offset")
    return ResourceEntry(obj["name"], offset, _nonneg_int(obj["bytes"], f"{where}.bytes"))


def _parse_objects(objects: Any, payload_size: int) -> tuple[list[TensorEntry], list[ResourceEntry]]:
    if not isinstance(objects, list):
        raise ArtifactError(f"objects: expected a JSON array, got {type(objects).__name__}")
    tensors: list[TensorEntry] = []
    resources: list[ResourceEntry] = []
    seen: set[str] = set()
    prev_end, prev_name = 0, None
    for i, obj in enumerate(objects):
        name = obj.get("name") if isinstance(obj, dict) else None
        where = f"object {i} ({name!r})" if isinstance(name, str) else f"object {i}"
        if not isinstance(obj, dict):
            raise ArtifactError(f"{where}: expected a JSON object")
        name = _nonempty_str(name, f"{where}.name")
        if name in seen:
            raise ArtifactError(f"{where}: duplicate object name")
        seen.add(name)
        kind = obj.get("kind")
        entry: TensorEntry | ResourceEntry
        if kind == "tensor":
            entry = _parse_tensor(obj, where)
            tensors.append(entry)
        elif kind == "resource":
            entry = _parse_resource(obj, where)
            resources.append(entry)
        else:
            raise ArtifactError(f"{where}: unknown kind {kind!r} (known: 'tensor', 'resource')")
        if entry.offset < prev_end:
            raise ArtifactError(
                f"{where}: offset {entry.offset} overlaps or precedes the end ({prev_end}) of {prev_name!r}"
                " (objects must be listed in offset order without overlap)"
            )
        end = entry.offset + entry.bytes
        if end > payload_size:
            raise ArtifactError(
                f"{where}: ends at payload byte {end} but the payload holds only {payload_size} bytes"
                " (file truncated?)"
            )
        prev_end, prev_name = end, name
    return tensors, resources


def _parse_identity(root: dict[str, Any], version: int) -> tuple[str, str | None]:
    if version == 1:
        _exact_members(root, frozenset({"model_id", "objects"}), "v1 JSON root")
        return _nonempty_str(root["model_id"], "model_id"), None
    _exact_members(root, frozenset({"identity", "objects"}), "v2 JSON root")
    identity = root["identity"]
    _exact_members(identity, frozenset({"model_id", "weights_id"}), "identity")
    return (
        _nonempty_str(identity["model_id"], "identity.model_id"),
        _nonempty_str(identity["weights_id"], "identity.weights_id"),
    )


def read_prefix(head: bytes, file_size: int) -> tuple[int, int, int]:
    """Parse the 16-byte prefix: returns (version, json_bytes, payload_offset)."""
    if len(head) < PREFIX_BYTES:
        raise ArtifactError(f"file is {file_size} bytes, too short for the 16-byte .ninfer prefix")
    magic = head[:8]
    if magic == MAGIC_V2:
        version = 2
    elif magic == MAGIC_V1:
        version = 1
    else:
        raise ArtifactError(f"not a .ninfer file: magic is {magic!r}, expected {MAGIC_V2!r} or {MAGIC_V1!r}")
    (json_bytes,) = struct.unpack("<Q", head[8:16])
    if json_bytes == 0 or json_bytes > MAX_JSON_BYTES or PREFIX_BYTES + json_bytes > file_size:
        raise ArtifactError(f"JSON directory length {json_bytes} does not fit in a {file_size}-byte file")
    payload_offset = align_up(PREFIX_BYTES + json_bytes, PAGE_ALIGN)
    if payload_offset > file_size:
        raise ArtifactError(f"payload offset {payload_offset} is past the end of the {file_size}-byte file")
    return version, json_bytes, payload_offset


def parse_directory(meta: bytes, file_size: int) -> Directory:
    """Validate the metadata region `meta` = bytes [0, payload_offset) of a file of `file_size` bytes."""
    version, json_bytes, payload_offset = read_prefix(meta[:PREFIX_BYTES], file_size)
    raw = meta[PREFIX_BYTES : PREFIX_BYTES + json_bytes]
    if any(meta[PREFIX_BYTES + json_bytes : payload_offset]):
        raise ArtifactError("the padding between the JSON directory and the payload is not all zero")
    try:
        root = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"JSON directory is not valid UTF-8 JSON: {exc}") from None
    if not isinstance(root, dict):
        raise ArtifactError("JSON directory root must be an object")
    model_id, weights_id = _parse_identity(root, version)
    tensors, resources = _parse_objects(root["objects"], file_size - payload_offset)
    return Directory(
        version, model_id, weights_id, tuple(tensors), tuple(resources), json_bytes, payload_offset
    )


def read_directory(path: str | os.PathLike[str]) -> Directory:
    """Read and validate only the header and directory of `path` (no payload is touched)."""
    path = Path(path)
    file_size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(PREFIX_BYTES)
        _, _, payload_offset = read_prefix(head, file_size)
        meta = head + f.read(payload_offset - PREFIX_BYTES)
    return parse_directory(meta, file_size)


# ---------------------------------------------------------------------------------------------- reading


class Artifact:
    """An open, validated `.ninfer` file. Tensors are zero-copy views of a private memory map."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.directory = read_directory(self.path)
        self._tensors = {e.name: e for e in self.directory.tensors}
        self._resources = {e.name: e for e in self.directory.resources}
        self._file = open(self.path, "rb")
        # ACCESS_COPY: a private mapping, so torch gets a writable buffer and the file is never modified.
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_COPY)

    @property
    def version(self) -> int:
        return self.directory.version

    @property
    def model_id(self) -> str:
        return self.directory.model_id

    @property
    def weights_id(self) -> str | None:
        return self.directory.weights_id

    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def resource_names(self) -> list[str]:
        return list(self._resources)

    def tensor_entry(self, name: str) -> TensorEntry:
        try:
            return self._tensors[name]
        except KeyError:
            raise ArtifactError(f"{self.path.name}: no tensor named {name!r}") from None

    def tensor(self, name: str) -> torch.Tensor:
        """A plain-format tensor as a zero-copy view of the file (shape and dtype from the directory)."""
        entry = self.tensor_entry(name)
        if entry.layout != formats.CONTIGUOUS:
            raise ArtifactError(
                f"tensor {name!r} is {entry.format}/{entry.layout}; use raw_bytes() (no dequantiser in this build)"
            )
        dtype = formats.PLAIN_FORMATS[entry.format]
        start = self.directory.payload_offset + entry.offset
        flat = torch.frombuffer(self._map, dtype=dtype, count=entry.bytes // dtype.itemsize, offset=start)
        return flat.view(entry.shape)

    def raw_bytes(self, name: str) -> memoryview:
        entry = self.tensor_entry(name)
        start = self.directory.payload_offset + entry.offset
        return memoryview(self._map)[start : start + entry.bytes]

    def resource(self, name: str) -> bytes:
        try:
            entry = self._resources[name]
        except KeyError:
            raise ArtifactError(
                f"{self.path.name}: no resource named {name!r} (has: {sorted(self._resources)})"
            ) from None
        start = self.directory.payload_offset + entry.offset
        return bytes(self._map[start : start + entry.bytes])

    def hf_config(self) -> dict[str, Any]:
        try:
            config = json.loads(self.resource("config.json"))
        except json.JSONDecodeError as exc:
            raise ArtifactError(
                f"{self.path.name}: resource 'config.json' is not valid JSON: {exc}"
            ) from None
        if not isinstance(config, dict):
            raise ArtifactError(f"{self.path.name}: resource 'config.json' must hold a JSON object")
        return config

    def close(self) -> None:
        # Views handed out keep the map's buffer exported; the map then closes when they are gone.
        try:
            self._map.close()
        except BufferError:
            pass
        self._file.close()

    def __enter__(self) -> Artifact:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_artifact(path: str | os.PathLike[str], *, check_registry: bool = True) -> Artifact:
    """Open and validate `path`; by default refuse an identity that is not registered, before any weight."""
    if check_registry:
        directory = read_directory(path)
        check_identity(
            directory.version,
            directory.model_id,
            directory.weights_id,
            Path(path).stat().st_size,
            source=str(path),
        )
    return Artifact(path)


# ---------------------------------------------------------------------------------------------- writing


@dataclass(frozen=True, slots=True)
class EncodedTensor:
    """A tensor already encoded in a non-plain format (quantised), written byte for byte."""

    shape: tuple[int, ...]
    format: str
    layout: str
    data: bytes


@dataclass(frozen=True, slots=True)
class LazyTensor:
    """A plain tensor whose data is produced only when it is written (conversion of large checkpoints
    streams tensor by tensor instead of holding the model in memory)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    load: Callable[[], torch.Tensor]


TensorSource = torch.Tensor | EncodedTensor | LazyTensor


def _tensor_object(name: str, value: TensorSource, offset: int) -> tuple[dict[str, Any], int]:
    if isinstance(value, EncodedTensor):
        shape, fmt, layout = list(value.shape), value.format, value.layout
    elif isinstance(value, LazyTensor):
        if value.dtype not in formats.FORMAT_FOR_DTYPE:
            raise ValueError(f"tensor {name!r}: dtype {value.dtype} has no .ninfer format")
        shape, fmt, layout = list(value.shape), formats.FORMAT_FOR_DTYPE[value.dtype], formats.CONTIGUOUS
    else:
        if value.dtype not in formats.FORMAT_FOR_DTYPE:
            raise ValueError(f"tensor {name!r}: dtype {value.dtype} has no .ninfer format")
        shape, fmt, layout = list(value.shape), formats.FORMAT_FOR_DTYPE[value.dtype], formats.CONTIGUOUS
    size = formats.encoded_bytes(shape, fmt, layout)
    obj = {"name": name, "kind": "tensor", "shape": shape, "format": fmt, "layout": layout}
    return {**obj, "offset": offset, "bytes": size}, size


def _tensor_bytes(value: TensorSource) -> bytes | memoryview:
    if isinstance(value, EncodedTensor):
        return value.data
    if isinstance(value, LazyTensor):
        loaded = value.load()
        if tuple(loaded.shape) != tuple(value.shape) or loaded.dtype != value.dtype:
            raise ValueError(
                f"lazy tensor produced {tuple(loaded.shape)} {loaded.dtype}, declared {value.shape}"
            )
        value = loaded
    t = value.detach().to("cpu").contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def encode_directory(root: dict[str, Any], version: int) -> bytes:
    """The prefix + JSON + zero padding for `root` (the metadata region before the payload)."""
    raw = json.dumps(root, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    magic = MAGIC_V2 if version == 2 else MAGIC_V1
    head = magic + struct.pack("<Q", len(raw)) + raw
    return head + bytes(align_up(len(head), PAGE_ALIGN) - len(head))


def write_artifact(
    path: str | os.PathLike[str],
    *,
    model_id: str,
    weights_id: str | None,
    tensors: Iterable[tuple[str, TensorSource]],
    resources: Iterable[tuple[str, bytes]] = (),
    version: int = 2,
) -> Path:
    """Write a container atomically (temp file + rename). Resources come first, then tensors."""
    if version not in (1, 2):
        raise ValueError(f"version must be 1 or 2, got {version}")
    if version == 2 and not weights_id:
        raise ValueError("a version-2 artifact needs a weights_id")
    objects: list[dict[str, Any]] = []
    sources: list[tuple[int, int, bytes | TensorSource]] = []  # (offset, size, data or tensor)
    offset = 0
    for name, data in resources:
        objects.append({"name": name, "kind": "resource", "encoding": RAW_BYTES, "offset": offset})
        objects[-1]["bytes"] = len(data)
        sources.append((offset, len(data), data))
        offset += len(data)
    for name, value in tensors:
        offset = align_up(offset, formats.TENSOR_ALIGN)
        obj, size = _tensor_object(name, value, offset)
        objects.append(obj)
        sources.append((offset, size, value))
        offset += size
    if version == 2:
        root: dict[str, Any] = {
            "identity": {"model_id": model_id, "weights_id": weights_id},
            "objects": objects,
        }
    else:
        root = {"model_id": model_id, "objects": objects}
    meta = encode_directory(root, version)
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    try:
        with open(tmp, "wb") as f:
            f.write(meta)
            pos = 0
            with progress(offset, f"writing {path.name}") as bar:
                for obj, (chunk_offset, size, source) in zip(objects, sources, strict=True):
                    chunk = source if isinstance(source, bytes) else _tensor_bytes(source)
                    if len(chunk) != size:
                        raise ValueError(
                            f"object {obj['name']!r}: {len(chunk)} bytes of data for a {size}-byte object"
                        )
                    f.write(bytes(chunk_offset - pos))
                    f.write(chunk)
                    pos = chunk_offset + size
                    bar.update(size)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    return path
