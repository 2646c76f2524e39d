"""The operator and the chart against a REAL kube-apiserver (v1.20, built from Debian's source package).

Setup (once per module): the session's control plane (etcd + kube-apiserver + kube-controller-manager,
see scripts/k8s/cluster.sh), the chart installed with `helm install`, and the operator run in-process by
kopf's KopfRunner authenticated as the chart's ServiceAccount, so the chart's least-privilege RBAC is
what the operator really gets.

NOTE: the cluster has no scheduler and no kubelet, and its job controller is off. Pods stay Pending, so
these tests finish a verification Job themselves by patching the Job's status subresource exactly as the
job controller would (`succeeded`/`failed` counts and a `Complete`/`Failed` condition). Deployment,
ReplicaSet and garbage-collector controllers are the real ones.
"""

from __future__ import annotations

import copy
import itertools
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from k8s_cluster import REPO, Cluster, wait_for
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from operator_samples import BAD_SHA, GOOD_SHA, SAMPLE

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

GROUP, VERSION, PLURAL = "ninfer.io", "v1alpha1", "ninferdeployments"
RELEASE_NS = "ninfer-system"
RELEASE = "ninfer"
SA_NAME = "ninfer-ninfer-operator"
GPU_LABEL = "nvidia.com/gpu.product"


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

    def condition(self, ns: str, name: str, type_: str) -> dict[str, Any] | None:
        conds = (self.cr(ns, name).get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == type_), None)

    def read_or_none(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def jobs(self, ns: str, name: str) -> list[Any]:
        return self.batch.list_namespaced_job(ns, label_selector=f"ninfer.io/deployment={name}").items

    def finish_job(self, ns: str, job_name: str, succeeded: bool) -> None:
        """Play the job controller: record the pod outcome and the terminal condition."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        cond = {
            "type": "Complete" if succeeded else "Failed",
            "status": "True",
            "lastProbeTime": now,
            "lastTransitionTime": now,
        }
        if not succeeded:
            cond.update(reason="BackoffLimitExceeded", message="Job has reached the specified backoff limit")
        status: dict[str, Any] = {"startTime": now, "conditions": [cond]}
        status.update({"succeeded": 1, "completionTime": now} if succeeded else {"failed": 1})
        self.batch.patch_namespaced_job_status(job_name, ns, {"status": status})

    def deployment_args(self, ns: str, name: str) -> list[str]:
        dep = self.apps.read_namespaced_deployment(name, ns)
        return next(c for c in dep.spec.template.spec.containers if c.name == "server").command


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Api:
    return Api(cluster.kubeconfig)


@pytest.fixture(scope="module")
def chart(cluster: Cluster, api: Api) -> Iterator[str]:
    """`helm install` of charts/ninfer-operator (CRD, RBAC, operator Deployment) into ninfer-system."""
    out = cluster.run(
        "helm",
        "install",
        RELEASE,
        str(REPO / "charts" / "ninfer-operator"),
        "--namespace",
        RELEASE_NS,
        "--create-namespace",
        "--set",
        "operator.retryDelaySeconds=1",
    )
    wait_for(
        lambda: cluster.kubectl("get", "ninferdeployments", "-A", check=False).returncode == 0,
        timeout=30,
        what="the NInferDeployment resource to be served",
    )
    yield out.stdout
    cluster.run("helm", "uninstall", RELEASE, "--namespace", RELEASE_NS, check=False)


@pytest.fixture(scope="module")
def operator(
    cluster: Cluster, api: Api, chart: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """The operator (operator/main.py) in kopf's KopfRunner, as the chart's ServiceAccount."""
    from kopf.testing import KopfRunner

    sa_config = cluster.service_account_kubeconfig(
        RELEASE_NS, SA_NAME, tmp_path_factory.mktemp("sa") / "config"
    )
    # a GPU node for the placement index (Nodes can exist without a kubelet)
    api.core.create_node(
        {"metadata": {"name": "gpu-node-1", "labels": {GPU_LABEL: "NVIDIA-GeForce-RTX-5090"}}}
    )
    env = {
        "KUBECONFIG": str(sa_config),
        "NINFER_OPERATOR_RETRY_DELAY": "1",
        "NINFER_OPERATOR_RESYNC_INTERVAL": "2",
        "NINFER_SERVER_IMAGE": "ninfer/server:test",
    }
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        args = ["run", "--standalone", "--all-namespaces", "--verbose", str(REPO / "operator" / "main.py")]
        with KopfRunner(args, timeout=60) as runner:
            yield runner
    log = runner.output
    Path(os.environ.get("NINFER_OPERATOR_TEST_LOG", "/tmp/ninfer-operator-test.log")).write_text(log)
    assert runner.exit_code == 0, log[-4000:]
    assert runner.exception is None, log[-4000:]
    assert "Traceback" not in log, log[max(0, log.index("Traceback") - 1000) : log.index("Traceback") + 3000]
    assert " 403 " not in log and "Forbidden" not in log, "RBAC denial:\n" + log[-4000:]


_ns_numbers = itertools.count(1)


@pytest.fixture
def ns(api: Api) -> str:
    """A fresh namespace per test, so each test owns its children and Events."""
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


def verified_deployment(api: Api, ns: str, name: str, spec: dict[str, Any]) -> Any:
    """Create the resource, let its verification Job succeed, return the Deployment."""
    create_cr(api, ns, name, spec)
    (job,) = wait_for(lambda: api.jobs(ns, name), what="the verification Job")
    api.finish_job(ns, job.metadata.name, succeeded=True)
    # status.servingSha256 is written at the end of the pass that created all the children
    wait_for(lambda: (api.cr(ns, name).get("status") or {}).get("servingSha256"), what="the rollout pass")
    return api.apps.read_namespaced_deployment(name, ns)


def test_chart_installs_crd_rbac_and_operator_deployment(cluster: Cluster, api: Api, chart: str) -> None:
    assert "STATUS: deployed" in chart
    crd = cluster.kubectl(
        "get", "crd", "ninferdeployments.ninfer.io", "-o", "jsonpath={.spec.names.shortNames}"
    )
    assert "ninfer" in crd.stdout
    dep = api.apps.read_namespaced_deployment("ninfer-ninfer-operator", RELEASE_NS)
    assert dep.spec.template.spec.service_account_name == SA_NAME
    assert "--standalone" in dep.spec.template.spec.containers[0].args
    rules = cluster.kubectl(
        "get", "clusterrole", "ninfer-ninfer-operator", "-o", "jsonpath={.rules[*].verbs}"
    ).stdout
    assert "*" not in rules  # least privilege: no wildcard verbs
    listed = cluster.run("helm", "list", "-n", RELEASE_NS).stdout
    assert RELEASE in listed


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda s: s["model"]["artifact"].pop("sha256"), "sha256"),
        (lambda s: s["model"]["artifact"].update(sha256="ABC"), "sha256"),
        (lambda s: s["model"]["artifact"].update(uri="https://example.com/m.ninfer"), "uri"),
        (lambda s: s["engine"].update(maxConcurrency=9), "maxConcurrency"),
        (lambda s: s["engine"].update(kvDtype="fp4"), "kvDtype"),
        (lambda s: s["engine"]["spec"].update(draftTokens=9), "draftTokens"),
        (lambda s: s["placement"].update(gpuProduct=[]), "gpuProduct"),
    ],
)
def test_schema_refuses_invalid_specs(api: Api, chart: str, mutate: Any, field: str) -> None:
    spec = copy.deepcopy(SAMPLE)
    mutate(spec)
    with pytest.raises(ApiException) as err:
        create_cr(api, "default", "invalid", spec)
    assert err.value.status == 422 and field in err.value.body


def test_verification_job_gates_the_deployment(api: Api, operator: Any, ns: str) -> None:
    spec = copy.deepcopy(SAMPLE)
    create_cr(api, ns, "m", spec)
    (job,) = wait_for(lambda: api.jobs(ns, "m"), what="the verification Job")
    assert job.spec.template.spec.containers[0].command[:2] == ["ninfer-artifact", "verify"]
    assert GOOD_SHA in job.spec.template.spec.containers[0].command
    assert job.metadata.owner_references[0].kind == "NInferDeployment"
    cond = wait_for(lambda: api.condition(ns, "m", "ArtifactVerified"), what="ArtifactVerified")
    assert cond["status"] == "Unknown" and cond["reason"] == "Verifying"
    assert api.read_or_none(api.apps.read_namespaced_deployment, "m", ns) is None, (
        "rolled out before verification"
    )

    api.finish_job(ns, job.metadata.name, succeeded=True)
    dep = wait_for(
        lambda: api.read_or_none(api.apps.read_namespaced_deployment, "m", ns), what="the Deployment"
    )
    pod = dep.spec.template.spec
    server = next(c for c in pod.containers if c.name == "server")
    expr = pod.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms[
        0
    ]
    assert expr.match_expressions[0].key == GPU_LABEL
    assert "NVIDIA-GeForce-RTX-5090-SHARED" in expr.match_expressions[0].values
    assert server.resources.limits["nvidia.com/gpu"] == "1"
    assert (
        server.startup_probe.http_get.path == "/health" and server.readiness_probe.http_get.path == "/health"
    )
    assert [c.name for c in pod.containers] == ["server", "monitor"]
    assert (
        dep.spec.strategy.rolling_update.max_surge == 0
        and dep.spec.strategy.rolling_update.max_unavailable == 1
    )
    assert dep.spec.progress_deadline_seconds >= 1800
    assert server.command[server.command.index("--expected-sha256") + 1] == GOOD_SHA
    # the Ingress is the last child of the pass
    wait_for(lambda: api.read_or_none(api.net.read_namespaced_ingress, "m", ns), what="the Ingress")
    assert api.core.read_namespaced_service("m", ns).spec.ports[0].port == 8080
    assert api.core.read_namespaced_config_map("m-model", ns).data["model.json"]
    ing = api.net.read_namespaced_ingress("m", ns)
    assert ing.metadata.annotations["nginx.ingress.kubernetes.io/upstream-hash-by"] == "$http_x_session_id"

    def verified_status() -> dict[str, Any] | None:
        status = api.cr(ns, "m").get("status") or {}
        return status if status.get("verifiedSha256") == GOOD_SHA and status.get("servingSha256") else None

    status = wait_for(verified_status, what="status with the verified digest")
    types = {c["type"]: c for c in status["conditions"]}
    assert types["ArtifactVerified"]["status"] == "True"
    assert types["PlacementSatisfiable"]["status"] == "True"
    assert set(types) == {"ArtifactVerified", "PlacementSatisfiable", "Progressing", "Available", "Ready"}
    assert (
        status["digest"] == GOOD_SHA[:12]
        and status["selector"] == "ninfer.io/deployment=m,ninfer.io/role=server"
    )
    # Pods never run here (no kubelet), so the rollout cannot finish: Ready must say so, not lie.
    assert types["Ready"]["status"] == "False"
    assert status["phase"] in ("Progressing", "Degraded")


def test_digest_mismatch_blocks_rollout_and_old_replicaset_keeps_serving(
    api: Api, operator: Any, ns: str
) -> None:
    verified_deployment(api, ns, "m", copy.deepcopy(SAMPLE))
    wait_for(lambda: api.apps.list_namespaced_replica_set(ns).items, what="the first ReplicaSet")
    patch_spec(api, ns, "m", {"model": {"artifact": {"sha256": BAD_SHA}}})
    job = wait_for(
        lambda: next((j for j in api.jobs(ns, "m") if BAD_SHA[:12] in j.metadata.name), None),
        what="the second Job",
    )
    api.finish_job(ns, job.metadata.name, succeeded=False)

    def mismatch() -> dict[str, Any] | None:
        cond = api.condition(ns, "m", "ArtifactVerified")
        return cond if cond and cond["reason"] == "DigestMismatch" else None

    cond = wait_for(mismatch, what="ArtifactVerified=False/DigestMismatch")
    assert cond["status"] == "False" and GOOD_SHA[:12] in cond["message"]
    assert api.cr(ns, "m")["status"]["phase"] == "Blocked"
    assert GOOD_SHA in api.deployment_args(ns, "m") and BAD_SHA not in api.deployment_args(ns, "m")
    replica_sets = api.apps.list_namespaced_replica_set(ns).items
    assert len(replica_sets) == 1
    assert replica_sets[0].spec.template.metadata.annotations["ninfer.io/sha256"] == GOOD_SHA
    events = wait_for(
        lambda: [e for e in api.core.list_namespaced_event(ns).items if e.reason == "DigestMismatch"],
        what="a DigestMismatch Event",
    )
    assert events[0].type == "Warning" and events[0].involved_object.name == "m"


def test_spec_change_rolls_out_a_new_replicaset(api: Api, operator: Any, ns: str) -> None:
    verified_deployment(api, ns, "m", copy.deepcopy(SAMPLE))
    wait_for(lambda: api.apps.list_namespaced_replica_set(ns).items, what="the first ReplicaSet")
    patch_spec(api, ns, "m", {"engine": {"maxConcurrency": 8}, "replicas": 1})

    def rolled() -> bool:
        args = api.deployment_args(ns, "m")
        return args[args.index("--max-concurrency") + 1] == "8"

    wait_for(rolled, what="--max-concurrency 8 in the pod template")
    assert api.apps.read_namespaced_deployment("m", ns).spec.replicas == 1
    wait_for(lambda: len(api.apps.list_namespaced_replica_set(ns).items) == 2, what="a second ReplicaSet")
    assert len(api.jobs(ns, "m")) == 1, "same digest: no second verification"
    # a new digest is verified again before it reaches the pods
    new_sha = "c" * 64
    patch_spec(api, ns, "m", {"model": {"artifact": {"sha256": new_sha}}})
    job = wait_for(
        lambda: next((j for j in api.jobs(ns, "m") if new_sha[:12] in j.metadata.name), None), what="Job"
    )
    assert new_sha not in api.deployment_args(ns, "m")
    api.finish_job(ns, job.metadata.name, succeeded=True)
    wait_for(lambda: new_sha in api.deployment_args(ns, "m"), what="the new digest in the pod template")
    wait_for(lambda: len(api.jobs(ns, "m")) == 1, what="the stale verification Job to be dropped")


def test_timer_repairs_drift(api: Api, operator: Any, ns: str) -> None:
    verified_deployment(api, ns, "m", copy.deepcopy(SAMPLE))
    api.apps.patch_namespaced_deployment("m", ns, {"spec": {"strategy": {"rollingUpdate": {"maxSurge": 1}}}})
    wait_for(
        lambda: api.apps.read_namespaced_deployment("m", ns).spec.strategy.rolling_update.max_surge == 0,
        timeout=30,
        what="maxSurge restored to 0",
    )
    api.core.delete_namespaced_service(
        "m", ns, _preload_content=False
    )  # the client cannot parse the Status reply
    wait_for(
        lambda: api.read_or_none(api.core.read_namespaced_service, "m", ns), timeout=30, what="Service back"
    )


def test_scale_subresource_drives_replicas(cluster: Cluster, api: Api, operator: Any, ns: str) -> None:
    verified_deployment(api, ns, "m", copy.deepcopy(SAMPLE))
    cluster.kubectl("scale", "-n", ns, "ninferdeployment/m", "--replicas=3")
    wait_for(lambda: api.apps.read_namespaced_deployment("m", ns).spec.replicas == 3, what="3 replicas")


def test_delete_cleans_up_children(api: Api, operator: Any, ns: str) -> None:
    verified_deployment(api, ns, "m", copy.deepcopy(SAMPLE))
    api.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "m")

    def all_gone() -> bool:
        return (
            api.read_or_none(api.apps.read_namespaced_deployment, "m", ns) is None
            and api.read_or_none(api.core.read_namespaced_service, "m", ns) is None
            and api.read_or_none(api.core.read_namespaced_config_map, "m-model", ns) is None
            and not api.jobs(ns, "m")
        )

    # the controller-manager's garbage collector follows the owner references the operator set
    wait_for(all_gone, timeout=90, interval=1, what="children garbage-collected")


def test_placement_unsatisfiable_without_matching_nodes(api: Api, operator: Any, ns: str) -> None:
    spec = copy.deepcopy(SAMPLE)
    spec["placement"]["gpuProduct"] = ["NVIDIA-H200"]
    create_cr(api, ns, "m", spec)
    cond = wait_for(lambda: api.condition(ns, "m", "PlacementSatisfiable"), what="PlacementSatisfiable")
    assert cond["status"] == "False" and cond["reason"] == "NoMatchingNodes"


def test_cross_field_errors_mark_the_resource_invalid(api: Api, operator: Any, ns: str) -> None:
    spec = copy.deepcopy(SAMPLE)
    spec["engine"] = {"maxContext": 8192, "kvCapacity": 4096}
    create_cr(api, ns, "m", spec)
    wait_for(lambda: (api.cr(ns, "m").get("status") or {}).get("phase") == "Invalid", what="phase Invalid")
    assert "kvCapacity" in api.condition(ns, "m", "Ready")["message"]
    assert not api.jobs(ns, "m")
