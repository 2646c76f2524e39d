"""`ninfer-artifact` as users run it: the installed console script, its output and its exit codes."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.artifact.container import read_artifact, write_artifact
from engine.testing.tiny import build_tiny

CLI = str(Path(sys.executable).with_name("ninfer-artifact"))


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *args], capture_output=True, text=True, check=False, timeout=300)


@pytest.fixture(scope="module")
def tiny_dense(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "dense.ninfer"
    result = run("build-tiny", str(out), "--arch", "dense", "--seed", "5")
    assert result.returncode == 0, result.stderr
    return out


def test_verify_exit_codes(tiny_dense: Path) -> None:
    digest = hashlib.sha256(tiny_dense.read_bytes()).hexdigest()
    ok = run("verify", str(tiny_dense), "--sha256", digest.upper())
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.split()[0] == digest
    wrong = "0" * 64
    bad = run("verify", str(tiny_dense), "--sha256", wrong)
    assert bad.returncode == 1
    assert f"expected {wrong}" in bad.stderr and f"actual   {digest}" in bad.stderr
    assert run("verify", str(tiny_dense), "--sha256", "abc").returncode == 2
    nothing = run("verify", str(tiny_dense))  # a development identity has no published digest
    assert nothing.returncode == 2 and "pass --sha256" in nothing.stderr
    assert run("verify", str(tiny_dense.with_name("missing.ninfer")), "--sha256", digest).returncode == 1


def test_verify_uses_the_registry_for_published_identities(tmp_path: Path) -> None:
    path = write_artifact(
        tmp_path / "fake27b.ninfer",
        model_id="qwen3.6-27b",
        weights_id="groupwise-int",
        tensors=[("x", torch.zeros(4))],
    )
    result = run("verify", str(path))
    assert result.returncode == 1
    assert "expected 7b51600ffd10632b9660f56085efdd9b751d79733ad32036a652234b64bebe7b" in result.stderr
    assert "registry entry qwen3.6-27b/groupwise-int" in result.stderr


def test_inspect_json_and_text(tiny_dense: Path) -> None:
    result = run("inspect", str(tiny_dense), "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["container_version"] == 2
    assert info["identity"] == {"model_id": "ninfer-tiny-dense", "weights_id": "bf16-tiny"}
    assert info["registered"] and info["development"]
    assert info["config"]["vocab_size"] == 248_320
    assert info["config"]["full_attention_layers"] == [3, 7]
    assert set(info["resources"]) >= {"config.json", "tokenizer.json", "chat_template.jinja"}
    text = run("inspect", str(tiny_dense))
    assert "identity   ninfer-tiny-dense/bf16-tiny (development)" in text.stdout


def test_inspect_reports_invalid_files(tmp_path: Path) -> None:
    path = tmp_path / "junk.ninfer"
    path.write_bytes(b"PK\x03\x04" + bytes(100))
    result = run("inspect", str(path))
    assert result.returncode == 1 and "not a .ninfer file" in result.stderr


def test_build_tiny_is_deterministic_and_real(tiny_dense: Path, tmp_path: Path) -> None:
    again = build_tiny(tmp_path / "again.ninfer", arch="dense", seed=5)
    assert again.read_bytes() == tiny_dense.read_bytes()
    other = build_tiny(tmp_path / "other.ninfer", arch="dense", seed=6)
    assert other.read_bytes() != tiny_dense.read_bytes()
    size_mb = tiny_dense.stat().st_size / 2**20
    assert 5 < size_mb < 100, size_mb
    with read_artifact(tiny_dense) as art:
        config = art.hf_config()
        assert config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"] + [
            "linear_attention"
        ] * 3 + ["full_attention"]
        assert any(n.startswith("mtp.") for n in art.tensor_names())
        tokenizer = json.loads(art.resource("tokenizer.json"))
        assert any(t["content"] == "<|im_start|>" and t["id"] == 248045 for t in tokenizer["added_tokens"])
        assert "<|im_start|>" in art.resource("chat_template.jinja").decode()


def test_build_tiny_moe_loads_into_the_model(tmp_path: Path) -> None:
    from engine.model import load_model

    path = build_tiny(tmp_path / "moe.ninfer", arch="moe", seed=1)
    model = load_model(read_artifact(path), dtype=torch.float32, with_mtp=True)
    assert model.mtp is not None


def test_convert_refuses_unregistered_identity_and_bad_dirs(tmp_path: Path) -> None:
    result = run(
        "convert", str(tmp_path), str(tmp_path / "o.ninfer"), "--model-id", "llama", "--weights-id", "bf16"
    )
    assert result.returncode == 1 and "llama/bf16 is not registered" in result.stderr
    result = run("convert", str(tmp_path), str(tmp_path / "o.ninfer"), "--model-id", "ninfer-tiny-dense")
    assert result.returncode == 1 and "no config.json" in result.stderr
    assert not (tmp_path / "o.ninfer").exists()


def test_bench_needs_a_geometry_and_says_so() -> None:
    script = str(Path(sys.executable).with_name("ninfer-bench"))
    result = subprocess.run([script], capture_output=True, text=True, check=False)
    assert result.returncode == 2 and "--synthetic" in result.stderr


def test_progress_shows_on_a_terminal_only(tiny_dense: Path) -> None:
    """Long work (here: hashing) draws a progress bar when stderr is a terminal, and nothing otherwise."""
    import fcntl
    import os
    import pty
    import struct
    import termios

    digest = hashlib.sha256(tiny_dense.read_bytes()).hexdigest()
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a real terminal's size
    proc = subprocess.Popen(
        [CLI, "verify", str(tiny_dense), "--sha256", digest], stdout=subprocess.DEVNULL, stderr=follower
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=120) == 0
    terminal = b"".join(chunks).decode(errors="replace")
    assert f"sha256 {tiny_dense.name}" in terminal and "%" in terminal
    piped = run("verify", str(tiny_dense), "--sha256", digest)
    assert "%" not in piped.stderr and "sha256 dense" not in piped.stderr
