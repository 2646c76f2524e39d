"""Static checks of the Dockerfile (no Docker engine on CI machines): targets, non-root, operator pins."""

from __future__ import annotations

import re
import tomllib

from k8s_cluster import REPO


def _stages() -> dict[str, str]:
    text = (REPO / "Dockerfile").read_text()
    parts = re.split(r"^FROM\s+\S+\s+AS\s+(\S+)\s*$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


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
