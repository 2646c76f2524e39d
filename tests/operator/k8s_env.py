"""The `k8s` tests' world: admin API clients, the chart installed with `helm install`, the operator run by
kopf's KopfRunner as the chart's ServiceAccount, and helpers that play the controllers this node-less
control plane lacks (the job controller, the kubelet).

conftest.py turns `install_chart` and `run_operator` into session fixtures, so every k8s test module shares
one chart release and one operator.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from k8s_cluster import REPO, Cluster, wait_for
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

GROUP, VERSION, PLURAL = "ninfer.io", "v1alpha1", "ninferdeployments"
RELEASE_NS = "ninfer-system"
RELEASE = "ninfer"
SA_NAME = "ninfer-ninfer-operator"
GPU_LABEL = "nvidia.com/gpu.product"
GATEWAY_CRDS = REPO / "scripts" / "k8s" / "crds" / "gateway-api-inference.yaml"
RESYNC_S = 30  # long on purpose: what a test sees quickly came from a watch, not from the resync loop


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Api:
    """Admin API clients for the test's own calls (the operator has its own, as the ServiceAccount)."""

    def __init__(self, kubeconfig: Path) -> None:
        api_client = config.new_client_from_config(config_file=str(kubeconfig))
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.net = client.NetworkingV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    def cr(self, ns: str, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)

    def status(self, ns: str, name: str) -> dict[str, Any]:
        return self.cr(ns, name).get("status") or {}

    def condition(self, ns: str, name: str, type_: str) -> dict[str, Any] | None:
        return next((c for c in self.status(ns, name).get("conditions") or [] if c["type"] == type_), None)

    def read_or_none(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def custom_or_none(self, group: str, plural: str, ns: str, name: str) -> dict[str, Any] | None:
        return self.read_or_none(self.custom.get_namespaced_custom_object, group, "v1", ns, plural, name)

    def jobs(self, ns: str, owner: str | None = None) -> list[Any]:
        """Verification Jobs in `ns` (owned by `owner` when given)."""
        items = self.batch.list_namespaced_job(ns, label_selector="ninfer.io/role=verify").items
        if owner is None:
            return items
        return [j for j in items if any(o.name == owner for o in j.metadata.owner_references or [])]

    def finish_job(self, ns: str, job_name: str, succeeded: bool, message: str = "") -> None:
        """Play the job controller (and, for a failure, the kubelet: a pod with the container's stderr as
        its termination message)."""
        cond = {"type": "Complete" if succeeded else "Failed", "status": "True", "lastProbeTime": now(),
                "lastTransitionTime": now()}  # fmt: skip
        if not succeeded:
            cond.update(reason="BackoffLimitExceeded", message="Job has reached the specified backoff limit")
            self.failed_pod(
                ns, job_name, message or "verify: MISMATCH for /artifacts/m\n  expected a\n  actual b"
            )
        status: dict[str, Any] = {"startTime": now(), "conditions": [cond]}
        status.update({"succeeded": 1, "completionTime": now()} if succeeded else {"failed": 1})
        self.batch.patch_namespaced_job_status(job_name, ns, {"status": status})

    def failed_pod(self, ns: str, job_name: str, message: str) -> None:
        pod = {
            "metadata": {"name": f"{job_name}-x", "labels": {"job-name": job_name}},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "verify", "image": "ninfer/server:test"}],
            },
        }
        self.core.create_namespaced_pod(ns, pod)
        terminated = {
            "exitCode": 1,
            "reason": "Error",
            "message": message,
            "startedAt": now(),
            "finishedAt": now(),
        }
        status = {"phase": "Failed", "containerStatuses": [{
            "name": "verify", "image": "ninfer/server:test", "imageID": "", "ready": False, "restartCount": 0,
            "state": {"terminated": terminated}}]}  # fmt: skip
        self.core.patch_namespaced_pod_status(f"{job_name}-x", ns, {"status": status})

    def deployment(self, ns: str, name: str) -> Any:
        return self.read_or_none(self.apps.read_namespaced_deployment, name, ns)

    def deployment_args(self, ns: str, name: str) -> list[str]:
        dep = self.apps.read_namespaced_deployment(name, ns)
        return next(c for c in dep.spec.template.spec.containers if c.name == "server").command

    def events(self, ns: str, reason: str) -> list[Any]:
        return [e for e in self.core.list_namespaced_event(ns).items if e.reason == reason]


def install_chart(cluster: Cluster) -> Iterator[str]:
    """The Gateway API CRDs (test copies), then `helm install` of charts/ninfer-operator."""
    cluster.kubectl("apply", "-f", str(GATEWAY_CRDS))
    out = cluster.run("helm", "install", RELEASE, str(REPO / "charts" / "ninfer-operator"), "--namespace",
                      RELEASE_NS, "--create-namespace", "--set", "operator.retryDelaySeconds=1")  # fmt: skip
    wait_for(
        lambda: all(
            cluster.kubectl("get", kind, "-A", check=False).returncode == 0
            for kind in ("ninferdeployments", "inferencepools", "httproutes")
        ),
        timeout=30,
        what="the NInferDeployment, InferencePool and HTTPRoute resources to be served",
    )
    yield out.stdout
    cluster.run("helm", "uninstall", RELEASE, "--namespace", RELEASE_NS, check=False)


@contextmanager
def run_operator(cluster: Cluster, api: Api, state: Path) -> Iterator[Any]:
    """operator/main.py in kopf's KopfRunner, as the chart's ServiceAccount; checks its log at the end."""
    from kopf.testing import KopfRunner

    sa_config = cluster.service_account_kubeconfig(RELEASE_NS, SA_NAME, state / "config")
    # a GPU node for the placement index (Nodes can exist without a kubelet)
    api.core.create_node(
        {"metadata": {"name": "gpu-node-1", "labels": {GPU_LABEL: "NVIDIA-GeForce-RTX-5090"}}}
    )
    env = {
        "KUBECONFIG": str(sa_config),
        "NINFER_OPERATOR_RETRY_DELAY": "1",
        "NINFER_OPERATOR_RESYNC_INTERVAL": str(RESYNC_S),
        "NINFER_SERVER_IMAGE": "ninfer/server:test",
    }
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        # NOTE: the client looks up proxies (iterating os.environ) on every call, from the operator's threads,
        # while pytest sets and deletes PYTEST_CURRENT_TEST in the same process: a KeyError race that only
        # this in-process harness has. The tests use no proxy.
        mp.setattr("kubernetes.client.configuration.getproxies", dict)
        args = ["run", "--standalone", "--all-namespaces", "--verbose", str(REPO / "operator" / "main.py")]
        with KopfRunner(args, timeout=60) as runner:
            yield runner
    log = runner.output
    Path(os.environ.get("NINFER_OPERATOR_TEST_LOG", "/tmp/ninfer-operator-test.log")).write_text(log)
    assert runner.exit_code == 0, log[-4000:]
    assert runner.exception is None, log[-4000:]
    assert "Traceback" not in log, log[max(0, log.index("Traceback") - 1000) : log.index("Traceback") + 3000]
    assert " 403 " not in log and "Forbidden" not in log, "RBAC denial:\n" + log[-4000:]
    errors = [line for line in log.splitlines() if "[ERROR" in line or " ERROR " in line]
    assert not errors, "the operator logged errors during normal progress:\n" + "\n".join(errors[:20])


_ns_numbers = itertools.count(1)


def new_namespace(api: Api) -> str:
    name = f"t{next(_ns_numbers)}"
    api.core.create_namespace({"metadata": {"name": name}})
    return name


def create_cr(api: Api, ns: str, name: str, spec: dict[str, Any]) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "NInferDeployment",
        "metadata": {"name": name},
        "spec": spec,
    }
    api.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)


def patch_spec(api: Api, ns: str, name: str, spec_patch: dict[str, Any]) -> None:
    api.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, {"spec": spec_patch})


def verified_deployment(api: Api, ns: str, name: str, spec: dict[str, Any], child: str | None = None) -> Any:
    """Create the resource, let its verification Job succeed, return the Deployment (named `child`)."""
    create_cr(api, ns, name, spec)
    (job,) = wait_for(lambda: api.jobs(ns, name), what="the verification Job")
    api.finish_job(ns, job.metadata.name, succeeded=True)
    # status.servingSha256 is written at the end of the pass that created all the children
    wait_for(lambda: api.status(ns, name).get("servingSha256"), what="the rollout pass")
    return api.apps.read_namespaced_deployment(child or name, ns)
