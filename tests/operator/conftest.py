"""Shared fixtures for the operator tests: import path for `ninfer_operator`, sample specs, and the k8s
world (control plane, chart, operator) shared by every `k8s` module."""

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
from k8s_env import Api, install_chart, new_namespace, run_operator  # noqa: E402
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


@pytest.fixture(scope="session")
def api(cluster: Cluster) -> Api:
    return Api(cluster.kubeconfig)


@pytest.fixture(scope="session")
def chart(cluster: Cluster, api: Api) -> Iterator[str]:
    """The Gateway API CRDs and `helm install` of charts/ninfer-operator, once for every k8s module."""
    yield from install_chart(cluster)


@pytest.fixture(scope="session")
def operator(
    cluster: Cluster, api: Api, chart: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    with run_operator(cluster, api, tmp_path_factory.mktemp("sa")) as runner:
        yield runner


@pytest.fixture
def ns(api: Api) -> str:
    """A fresh namespace per test, so each test owns its children and Events."""
    return new_namespace(api)
