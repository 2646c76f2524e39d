"""`ninfer-serve --expected-sha256`: the server refuses to start on a digest mismatch (what the Kubernetes
operator passes to every replica), and exports the verified digest in `ninfer_model_info`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
from api_helpers import VENV_BIN, free_port, start_server, stop_server

from engine.artifact.digest import sha256_file
from engine.testing.demo import demo_artifact_path


def test_mismatched_digest_refuses_to_start(tmp_path: Path) -> None:
    artifact = demo_artifact_path()
    wrong = "ab" * 32
    result = subprocess.run(
        [
            str(VENV_BIN / "ninfer-serve"),
            str(artifact),
            "--port",
            str(free_port()),
            "--expected-sha256",
            wrong,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1
    assert f"expected {wrong}; refusing to start" in result.stderr
    assert sha256_file(artifact) in result.stderr


def test_malformed_digest_is_a_flag_error() -> None:
    result = subprocess.run(
        [str(VENV_BIN / "ninfer-serve"), "--expected-sha256", "xyz"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2 and "must be 64 hex digits" in result.stderr


def test_matching_digest_serves_and_is_exported(tmp_path: Path) -> None:
    artifact = demo_artifact_path()
    digest = sha256_file(artifact)
    port = free_port()
    cmd = [
        str(VENV_BIN / "ninfer-serve"), str(artifact), "--port", str(port), "--expected-sha256", digest.upper(),
        "--metrics-vllm-aliases", "--log-stats-interval-ms", "0",
    ]  # fmt: skip
    url, process = start_server(cmd, tmp_path / "server.log", port)
    try:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        info = next(line for line in text.splitlines() if line.startswith("ninfer_model_info{"))
        assert f'artifact_sha256="{digest}"' in info and 'model_id="ninfer-tiny-dense"' in info
        assert "\nvllm:num_requests_waiting" in text
        assert "\nninfer_requests_running" in text
    finally:
        stop_server(process)
