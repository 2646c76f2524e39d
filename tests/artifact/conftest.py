"""Fixtures for the artifact tests: small containers written by our writer, and a way to edit their JSON."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.artifact.container import EncodedTensor, encode_directory, write_artifact


def sample_objects() -> tuple[list[tuple[str, Any]], list[tuple[str, bytes]]]:
    gen = torch.Generator().manual_seed(7)
    tensors: list[tuple[str, Any]] = [
        ("w.bf16", torch.randn(3, 5, generator=gen).to(torch.bfloat16)),
        ("w.fp32", torch.randn(7, generator=gen)),
        ("w.i32", torch.arange(-4, 5, dtype=torch.int32).reshape(3, 3)),
        ("w.scalar", torch.tensor(2.5)),
        ("w.f16", torch.randn(2, 3, 4, generator=gen).to(torch.float16)),
        (
            "w.q5",
            EncodedTensor((2, 130), "Q5G64_F16S", "row-split-k128-v1", bytes(range(256)) * 2 + bytes(16)),
        ),
    ]
    resources = [
        ("config.json", b'{"model_type": "qwen3_5_text"}'),
        ("notes.txt", "h\u00e9llo \u2603".encode()),
    ]
    return tensors, resources


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
