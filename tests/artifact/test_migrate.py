"""`ninfer-artifact migrate`: v1 -> v2 in place, payload untouched, failures restored from the backup."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.artifact.container import ArtifactError, EncodedTensor, read_directory, write_artifact
from engine.artifact.migrate import BACKUP_SUFFIX, migrate_v1_to_v2


def _v1_file(path: Path, model_id: str = "qwen3.6-27b", name_pad: int = 0) -> Path:
    gen = torch.Generator().manual_seed(3)
    return write_artifact(
        path,
        model_id=model_id,
        weights_id=None,
        version=1,
        resources=[("tokenizer.json", b'{"v": 1}')],
        tensors=[
            ("text/embed" + "x" * name_pad, torch.randn(16, 8, generator=gen).to(torch.bfloat16)),
            ("text/layer0/q", EncodedTensor((2, 130), "Q4G64_F16S", "row-split-k128-v1", bytes(range(256)) + bytes(16))),
            ("text/a_log", torch.randn(4, generator=gen)),
        ],
    )  # fmt: skip


def _payload(path: Path) -> bytes:
    return path.read_bytes()[read_directory(path).payload_offset :]


def test_migrate_rewrites_only_metadata(tmp_path: Path) -> None:
    path = _v1_file(tmp_path / "m.ninfer")
    before = read_directory(path)
    payload = _payload(path)
    result = migrate_v1_to_v2(path)
    assert not result.already_v2
    after = read_directory(path)
    assert (after.version, after.model_id, after.weights_id) == (2, "qwen3.6-27b", "groupwise-int")
    assert after.payload_offset == before.payload_offset
    assert after.tensors == before.tensors and after.resources == before.resources
    assert _payload(path) == payload  # byte for byte
    assert not path.with_name(path.name + BACKUP_SUFFIX).exists()
    assert migrate_v1_to_v2(path).already_v2


def test_failure_mid_write_restores_the_v1_file(tmp_path: Path) -> None:
    path = _v1_file(tmp_path / "m.ninfer")
    original = path.read_bytes()

    def crash(p: Path) -> None:
        assert p.read_bytes()[:8] == b"NINFER\x00\x02"  # the new header really was written
        raise OSError("simulated power loss after the metadata write")

    with pytest.raises(OSError, match="simulated power loss"):
        migrate_v1_to_v2(path, after_write=crash)
    assert path.read_bytes() == original
    assert not path.with_name(path.name + BACKUP_SUFFIX).exists()


def test_unknown_v1_model_needs_a_weights_id(tmp_path: Path) -> None:
    path = _v1_file(tmp_path / "m.ninfer", model_id="ninfer-tiny-dense")
    original = path.read_bytes()
    with pytest.raises(ArtifactError, match="has no published weights_id; pass --weights-id"):
        migrate_v1_to_v2(path)
    assert path.read_bytes() == original
    assert migrate_v1_to_v2(path, weights_id="bf16-tiny").weights_id == "bf16-tiny"


def test_directory_that_would_not_fit_the_padding_changes_nothing(tmp_path: Path) -> None:
    for pad in range(0, 4096, 3):  # find a v1 directory that leaves < 40 bytes of padding
        path = _v1_file(tmp_path / "m.ninfer", name_pad=pad)
        directory = read_directory(path)
        if 0 < directory.payload_offset - 16 - directory.json_bytes < 40:
            break
    else:
        pytest.fail("no padding-filling name length found")
    original = path.read_bytes()
    with pytest.raises(ArtifactError, match="the payload cannot stay in place, nothing was changed"):
        migrate_v1_to_v2(path)
    assert path.read_bytes() == original


def test_cli_migrate_and_already_v2(tmp_path: Path) -> None:
    path = _v1_file(tmp_path / "m.ninfer")
    cli = [sys.executable, "-m", "engine.artifact.cli", "migrate", str(path)]
    first = subprocess.run(cli, capture_output=True, text=True, check=False)
    assert first.returncode == 0, first.stderr
    assert "migrated to v2 as qwen3.6-27b/groupwise-int" in first.stdout
    second = subprocess.run(cli, capture_output=True, text=True, check=False)
    assert second.returncode == 0 and "already v2" in second.stdout
