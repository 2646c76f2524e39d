"""Round trips through the `.ninfer` writer and the memory-mapped reader, for every object kind."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from artifact_samples import sample_objects

from engine.artifact.container import (
    MAGIC_V1,
    MAGIC_V2,
    Artifact,
    ArtifactError,
    LazyTensor,
    read_artifact,
    read_directory,
    write_artifact,
)


def test_round_trip_every_object_kind(small_artifact: Path) -> None:
    tensors, resources = sample_objects()
    with read_artifact(small_artifact) as art:
        assert (art.version, art.model_id, art.weights_id) == (2, "ninfer-tiny-dense", "test")
        assert art.tensor_names() == [name for name, _ in tensors]
        for name, value in tensors:
            if isinstance(value, torch.Tensor):
                got = art.tensor(name)
                assert got.dtype == value.dtype and got.shape == value.shape
                assert torch.equal(got, value), name
            else:
                assert bytes(art.raw_bytes(name)) == value.data
        for name, data in resources:
            assert art.resource(name) == data
        assert art.hf_config() == {"model_type": "qwen3_5_text"}


def test_layout_on_disk(small_artifact: Path) -> None:
    data = small_artifact.read_bytes()
    assert data[:8] == MAGIC_V2
    (n,) = struct.unpack("<Q", data[8:16])
    root = json.loads(data[16 : 16 + n])
    assert set(root) == {"identity", "objects"}
    payload_offset = (16 + n + 4095) // 4096 * 4096
    assert not any(data[16 + n : payload_offset])
    offsets = [o["offset"] for o in root["objects"]]
    assert offsets == sorted(offsets)
    for obj in root["objects"]:
        if obj["kind"] == "tensor":
            assert obj["offset"] % 256 == 0
    assert read_directory(small_artifact).payload_offset == payload_offset


def test_tensors_are_zero_copy_views_of_the_map(small_artifact: Path) -> None:
    art = Artifact(small_artifact)
    a, b = art.tensor("w.fp32"), art.tensor("w.fp32")
    assert a.data_ptr() == b.data_ptr()
    a[0] = 123.0  # a private (copy-on-write) mapping: the file never changes
    assert b[0] == 123.0
    assert Artifact(small_artifact).tensor("w.fp32")[0] != 123.0


def test_v1_round_trip(tmp_path: Path) -> None:
    path = write_artifact(
        tmp_path / "v1.ninfer", model_id="qwen3.6-27b", weights_id=None, version=1,
        tensors=[("x", torch.ones(4, dtype=torch.bfloat16))],
    )  # fmt: skip
    assert path.read_bytes()[:8] == MAGIC_V1
    directory = read_directory(path)
    assert (directory.version, directory.model_id, directory.weights_id) == (1, "qwen3.6-27b", None)
    with pytest.raises(ArtifactError, match="version 1 is not served; run `ninfer-artifact migrate"):
        read_artifact(path)


def test_lazy_tensors_are_loaded_only_when_written(tmp_path: Path) -> None:
    calls: list[str] = []

    def load() -> torch.Tensor:
        calls.append("x")
        return torch.full((2, 2), 3.0)

    path = write_artifact(
        tmp_path / "lazy.ninfer", model_id="ninfer-tiny-moe", weights_id="w",
        tensors=[("x", LazyTensor((2, 2), torch.float32, load))],
    )  # fmt: skip
    assert calls == ["x"]
    assert torch.equal(read_artifact(path).tensor("x"), torch.full((2, 2), 3.0))
    bad = LazyTensor((2, 3), torch.float32, load)
    with pytest.raises(ValueError, match="lazy tensor produced"):
        write_artifact(tmp_path / "bad.ninfer", model_id="m", weights_id="w", tensors=[("x", bad)])
    assert not (tmp_path / "bad.ninfer").exists() and not list(tmp_path.glob("*.partial"))


def test_unregistered_identity_is_refused_before_any_weight(tmp_path: Path) -> None:
    path = write_artifact(
        tmp_path / "u.ninfer", model_id="llama-3", weights_id="bf16", tensors=[("x", torch.zeros(2))]
    )
    with pytest.raises(
        ArtifactError, match="identity llama-3/bf16 is not registered; accepted: qwen3.6-27b/groupwise-int"
    ):
        read_artifact(path)
    assert read_artifact(path, check_registry=False).model_id == "llama-3"


def test_published_identity_with_the_wrong_size_is_refused(tmp_path: Path) -> None:
    path = write_artifact(
        tmp_path / "p.ninfer",
        model_id="qwen3.6-27b",
        weights_id="groupwise-int",
        tensors=[("x", torch.zeros(2))],
    )
    with pytest.raises(ArtifactError, match="must be 17495365888 bytes"):
        read_artifact(path)
