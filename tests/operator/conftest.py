"""Shared fixtures for the operator tests: import path for `ninfer_operator`, and sample specs."""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from k8s_cluster import Cluster, start_cluster, stop_cluster  # noqa: E402
from operator_samples import SAMPLE  # noqa: E402


@pytest.fixture
def sample_spec() -> dict[str, Any]:
    return copy.deepcopy(SAMPLE)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """etcd + kube-apiserver + kube-controller-manager on loopback, once per session."""
    state = tmp_path_factory.mktemp("k8s")
    running = start_cluster(state)
    try:
        yield running
    finally:
        stop_cluster(running)
