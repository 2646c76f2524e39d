"""The operator and the chart against a REAL kube-apiserver (v1.20, built from Debian's source package).

Setup (once per session, k8s_env.py + conftest.py): the control plane (etcd + kube-apiserver + kube-controller-manager,
see scripts/k8s/cluster.sh), the chart installed with `helm install`, and the operator run as a `kopf run`
process authenticated as the chart's ServiceAccount, so the chart's least-privilege RBAC is
what the operator really gets. The Gateway API CRDs (scripts/k8s/crds/) are installed first, so the
InferencePool and HTTPRoute the operator renders are validated by the API server against their schemas.

NOTE: the cluster has no scheduler and no kubelet, and its job controller is off. Pods stay Pending, so
these tests finish a verification Job themselves by patching the Job's status subresource exactly as the
job controller would (`succeeded`/`failed` counts and a `Complete`/`Failed` condition). Deployment,
ReplicaSet and garbage-collector controllers are the real ones.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from k8s_cluster import Cluster, wait_for
from k8s_env import (
    GPU_LABEL,
    GROUP,
    PLURAL,
    RELEASE,
    RELEASE_NS,
    SA_NAME,
    VERSION,
    Api,
    create_cr,
    patch_spec,
    verified_deployment,
)
from kubernetes.client.exceptions import ApiException
from operator_samples import BAD_SHA, GOOD_SHA, SAMPLE

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


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
        (lambda s: s["engine"]["spec"].update(draftTokens=16), "draftTokens"),  # dflash allows 15
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
    assert api.custom_or_none("inference.networking.k8s.io", "inferencepools", ns, "m") is None
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
        server.startup_probe.http_get.path == "/health" and server.liveness_probe.http_get.path == "/health"
    )
    assert server.readiness_probe.http_get.path == "/ready"
    assert pod.termination_grace_period_seconds == 615
    assert "--metrics-vllm-aliases" in server.command
    assert [c.name for c in pod.containers] == ["server", "monitor"]
    assert (
        dep.spec.strategy.rolling_update.max_surge == 0
        and dep.spec.strategy.rolling_update.max_unavailable == 1
    )
    assert dep.spec.progress_deadline_seconds >= 1800
    assert server.command[server.command.index("--expected-sha256") + 1] == GOOD_SHA
    # the HTTPRoute is the last routing child of the pass
    route = wait_for(
        lambda: api.custom_or_none("gateway.networking.k8s.io", "httproutes", ns, "m"), what="the HTTPRoute"
    )
    pool = api.custom_or_none("inference.networking.k8s.io", "inferencepools", ns, "m")
    assert pool["spec"]["selector"]["matchLabels"] == dep.spec.selector.match_labels
    assert pool["spec"]["targetPorts"] == [{"number": 8080}]
    assert pool["spec"]["endpointPickerRef"]["name"] == "m-epp"
    assert pool["spec"]["endpointPickerRef"]["port"] == {"number": 9002}
    assert pool["metadata"]["ownerReferences"][0]["kind"] == "NInferDeployment"
    assert route["spec"]["parentRefs"][0]["name"] == "inference-gateway"
    assert route["spec"]["parentRefs"][0]["sectionName"] == "http"
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"][0]["kind"] == "InferencePool" and rule["backendRefs"][0]["name"] == "m"
    assert api.read_or_none(api.net.read_namespaced_ingress, "m", ns) is None, "no legacy Ingress"
    assert api.core.read_namespaced_service("m", ns).spec.ports[0].port == 8080
    assert api.core.read_namespaced_config_map("m-model", ns).data["model.json"]

    def verified_status() -> dict[str, Any] | None:
        status = api.cr(ns, "m").get("status") or {}
        return status if status.get("verifiedSha256") == GOOD_SHA and status.get("servingSha256") else None

    status = wait_for(verified_status, what="status with the verified digest")
    types = {c["type"]: c for c in status["conditions"]}
    assert types["ArtifactVerified"]["status"] == "True"
    assert types["PlacementSatisfiable"]["status"] == "True"
    assert set(types) == {
        "ArtifactVerified", "PlacementSatisfiable", "ChildrenReconciled", "Progressing", "Available", "Ready"
    }  # fmt: skip
    assert types["ChildrenReconciled"]["status"] == "True"
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
    status = api.status(ns, "m")
    assert status["phase"] == "Blocked"
    # the digest column shows what serves, not what the spec asks for
    assert status["servingDigest"] == GOOD_SHA[:12] and status["digest"] == BAD_SHA[:12]
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


def test_legacy_ingress_and_switching_routing_removes_the_old_children(
    api: Api, operator: Any, ns: str
) -> None:
    spec = copy.deepcopy(SAMPLE)
    spec["routing"] = {
        "ingress": {"sessionHeader": "X-Session-Id", "host": "llm.example.com", "tlsSecret": "tls"}
    }
    verified_deployment(api, ns, "m", spec)
    ing = wait_for(lambda: api.read_or_none(api.net.read_namespaced_ingress, "m", ns), what="the Ingress")
    assert ing.metadata.annotations["nginx.ingress.kubernetes.io/upstream-hash-by"] == "$http_x_session_id"
    assert ing.spec.tls[0].secret_name == "tls"
    assert "--metrics-vllm-aliases" not in api.deployment_args(ns, "m")
    api.custom.patch_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, "m", {"spec": {"routing": {"ingress": None, "gateway": {"name": "gw"}}}}
    )
    wait_for(
        lambda: api.read_or_none(api.net.read_namespaced_ingress, "m", ns) is None, what="Ingress removed"
    )
    wait_for(lambda: api.custom_or_none("gateway.networking.k8s.io", "httproutes", ns, "m"), what="HTTPRoute")
    wait_for(lambda: "--metrics-vllm-aliases" in api.deployment_args(ns, "m"), what="aliases for the picker")


def test_watch_repairs_drift_at_once(api: Api, operator: Any, ns: str) -> None:
    verified_deployment(api, ns, "m", copy.deepcopy(SAMPLE))
    api.apps.patch_namespaced_deployment("m", ns, {"spec": {"strategy": {"rollingUpdate": {"maxSurge": 1}}}})
    wait_for(
        lambda: api.apps.read_namespaced_deployment("m", ns).spec.strategy.rolling_update.max_surge == 0,
        timeout=15,
        what="maxSurge restored to 0 (a watch event, well before the resync loop)",
    )
    api.core.delete_namespaced_service(
        "m", ns, _preload_content=False
    )  # the client cannot parse the Status reply
    wait_for(
        lambda: api.read_or_none(api.core.read_namespaced_service, "m", ns), timeout=15, what="Service back"
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
    (job,) = wait_for(lambda: api.jobs(ns, "m"), what="the verification Job")
    api.finish_job(ns, job.metadata.name, succeeded=True)
    wait_for(lambda: api.status(ns, "m").get("phase") == "Unschedulable", what="phase Unschedulable")


def test_cross_field_errors_mark_the_resource_invalid(api: Api, operator: Any, ns: str) -> None:
    spec = copy.deepcopy(SAMPLE)
    spec["engine"] = {"maxContext": 8192, "kvCapacity": 4096}
    create_cr(api, ns, "m", spec)
    wait_for(lambda: api.status(ns, "m").get("phase") == "Invalid", what="phase Invalid")
    assert "kvCapacity" in api.condition(ns, "m", "Ready")["message"]
    assert not api.jobs(ns, "m")
    (event,) = wait_for(lambda: api.events(ns, "InvalidSpec"), what="an InvalidSpec Event")
    assert event.type == "Warning" and "kvCapacity" in event.message
