"""Strict validation: every malformed container is refused with a message naming the object."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

from engine.artifact.container import ArtifactError, read_directory


def _obj(root: dict[str, Any], name: str) -> dict[str, Any]:
    return next(o for o in root["objects"] if o["name"] == name)


CASES = [
    ("unknown root member", lambda r: r.update(extra=1), r"v2 JSON root: unknown member\(s\) \['extra'\]"),
    ("missing identity", lambda r: r.pop("identity"), r"v2 JSON root: missing member\(s\) \['identity'\]"),
    ("unknown identity member", lambda r: r["identity"].update(target="x"), r"identity: unknown member\(s\) \['target'\]"),
    ("empty weights_id", lambda r: r["identity"].update(weights_id=""), "identity.weights_id: must be a nonempty string"),
    ("null member", lambda r: _obj(r, "w.fp32").update(layout=None), r"'w.fp32'.*null member\(s\) \['layout'\]"),
    ("unknown tensor member", lambda r: _obj(r, "w.fp32").update(dtype="f32"), r"'w.fp32'.*unknown member\(s\) \['dtype'\]"),
    ("missing tensor member", lambda r: _obj(r, "w.i32").pop("layout"), r"'w.i32'.*missing member\(s\) \['layout'\]"),
    ("unknown kind", lambda r: _obj(r, "w.fp32").update(kind="blob"), r"'w.fp32'.*unknown kind 'blob'"),
    ("unknown format", lambda r: _obj(r, "w.fp32").update(format="FP8"), r"'w.fp32'.*unknown format 'FP8'"),
    ("unknown layout", lambda r: _obj(r, "w.fp32").update(layout="tiled"), r"'w.fp32'.*unknown layout 'tiled'"),
    ("bad shape", lambda r: _obj(r, "w.fp32").update(shape=[7, 0]), r"'w.fp32'.*shape must be a list of positive"),
    ("bytes mismatch", lambda r: _obj(r, "w.bf16").update(bytes=31), r"'w.bf16'.*bytes is 31 but shape \[3, 5\] in BF16/contiguous-le-v1 needs 30"),
    ("quant bytes mismatch", lambda r: _obj(r, "w.q5").update(bytes=520), r"'w.q5'.*needs 528 bytes"),
    ("format/layout mismatch", lambda r: _obj(r, "w.fp32").update(layout="row-split-k128-v1"), r"'w.fp32'.*cannot use layout"),
    ("misaligned", lambda r: _obj(r, "w.fp32").update(offset=_obj(r, "w.fp32")["offset"] + 4), r"'w.fp32'.*not 256-byte aligned"),
    ("overlap", lambda r: _obj(r, "w.fp32").update(offset=_obj(r, "w.bf16")["offset"]), r"'w.fp32'.*overlaps or precedes the end .* of 'w.bf16'"),
    ("duplicate name", lambda r: _obj(r, "w.fp32").update(name="w.bf16"), r"'w.bf16'.*duplicate object name"),
    ("bad resource encoding", lambda r: _obj(r, "notes.txt").update(encoding="gzip"), r"'notes.txt'.*unknown resource encoding"),
    ("negative offset", lambda r: _obj(r, "notes.txt").update(offset=-1), r"'notes.txt'.*offset: must be a non-negative integer"),
]  # fmt: skip


@pytest.mark.parametrize(("label", "mutate", "message"), CASES, ids=[c[0] for c in CASES])
def test_malformed_directory_is_refused(
    small_artifact: Path, rewrite, label: str, mutate, message: str
) -> None:
    rewrite(small_artifact, mutate)
    with pytest.raises(ArtifactError, match=message):
        read_directory(small_artifact)


def test_out_of_order_objects_are_refused(small_artifact: Path, rewrite) -> None:
    rewrite(small_artifact, lambda r: r["objects"].reverse())
    with pytest.raises(ArtifactError, match="overlaps or precedes"):
        read_directory(small_artifact)


def test_v1_root_must_be_exact(small_artifact: Path, rewrite) -> None:
    rewrite(small_artifact, lambda r: None, version=1)
    with pytest.raises(ArtifactError, match=r"v1 JSON root: unknown member\(s\) \['identity'\]"):
        read_directory(small_artifact)


def test_truncated_file_names_the_object(small_artifact: Path) -> None:
    data = small_artifact.read_bytes()
    small_artifact.write_bytes(data[:-100])
    with pytest.raises(
        ArtifactError,
        match=r"'w.q5'.*ends at payload byte 2064 but the payload holds only 1964 bytes \(file truncated",
    ):
        read_directory(small_artifact)


def test_truncated_directory(small_artifact: Path) -> None:
    small_artifact.write_bytes(small_artifact.read_bytes()[:200])
    with pytest.raises(ArtifactError, match="does not fit in a 200-byte file"):
        read_directory(small_artifact)


@pytest.mark.parametrize(
    ("head", "message"),
    [
        (b"GGUF\x00\x00\x00\x03", "not a .ninfer file"),
        (b"NINFER\x00\x03", "not a .ninfer file"),
        (b"NIN", "too short"),
    ],
)
def test_bad_magic(tmp_path: Path, head: bytes, message: str) -> None:
    path = tmp_path / "x.ninfer"
    path.write_bytes(head + (struct.pack("<Q", 2) + b"{}" if len(head) == 8 else b""))
    with pytest.raises(ArtifactError, match=message):
        read_directory(path)


def test_invalid_json_and_nonzero_padding(small_artifact: Path) -> None:
    data = bytearray(small_artifact.read_bytes())
    (n,) = struct.unpack("<Q", data[8:16])
    data[16 + n + 10] = 1
    small_artifact.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="padding .* is not all zero"):
        read_directory(small_artifact)
    data[16 + n + 10] = 0
    data[16] = ord("[")
    small_artifact.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="not valid UTF-8 JSON"):
        read_directory(small_artifact)
