"""Fixtures for the artifact tests: small containers written by our writer, and a way to edit their JSON."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from artifact_samples import sample_objects

from engine.artifact.container import encode_directory, write_artifact


@pytest.fixture
def small_artifact(tmp_path: Path) -> Path:
    tensors, resources = sample_objects()
    return write_artifact(
        tmp_path / "small.ninfer",
        model_id="ninfer-tiny-dense",
        weights_id="test",
        tensors=tensors,
        resources=resources,
    )


def read_root(path: Path) -> tuple[dict[str, Any], int, bytes]:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[8:16])
    root = json.loads(data[16 : 16 + n])
    payload_offset = (16 + n + 4095) // 4096 * 4096
    return root, data[7], data[payload_offset:]


@pytest.fixture
def rewrite() -> Callable[[Path, Callable[[dict[str, Any]], None]], Path]:
    """Rewrite a container's JSON directory through `mutate(root)`, keeping its payload bytes."""

    def _rewrite(path: Path, mutate: Callable[[dict[str, Any]], None], version: int | None = None) -> Path:
        root, file_version, payload = read_root(path)
        mutate(root)
        path.write_bytes(encode_directory(root, version or file_version) + payload)
        return path

    return _rewrite
