"""Issue #23's findings from driving the operator by hand, each fixed and checked against the real
kube-apiserver (same session world as test_k8s_operator.py: chart, Gateway CRDs, operator as the chart's
ServiceAccount; k8s_env.py)."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest
from k8s_cluster import Cluster, wait_for
from k8s_env import RESYNC_S, Api, create_cr, patch_spec, verified_deployment
from kubernetes.client.exceptions import ApiException
from ninfer_operator.names import child_name
from operator_samples import BAD_SHA, SAMPLE

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


def test_a_dotted_name_gets_valid_children(api: Api, operator: Any, ns: str) -> None:
    """`qwen3.6-27b` is a valid resource name but not a Service name: the children use a derived label."""
    child = child_name("qwen3.6-27b")
    verified_deployment(api, ns, "qwen3.6-27b", copy.deepcopy(SAMPLE), child=child)
    wait_for(lambda: api.read_or_none(api.core.read_namespaced_service, child, ns), what="the Service")
    cond = wait_for(lambda: api.condition(ns, "qwen3.6-27b", "ChildrenReconciled"), what="ChildrenReconciled")
    assert cond["status"] == "True", cond


def test_a_name_longer_than_a_label_is_refused_by_the_schema(api: Api, chart: str) -> None:
    with pytest.raises(ApiException) as err:
        create_cr(api, "default", "a" * 69, copy.deepcopy(SAMPLE))
    assert err.value.status == 422 and "metadata.name" in err.value.body


def test_a_child_the_api_server_refuses_is_a_condition_and_an_event(api: Api, operator: Any, ns: str) -> None:
    spec = copy.deepcopy(SAMPLE)
    spec["resources"] = {"requests": {"cpu": "lots"}}  # the CRD takes any quantity string; the Deployment not
    create_cr(api, ns, "m", spec)
    (job,) = wait_for(lambda: api.jobs(ns, "m"), what="the verification Job")
    api.finish_job(ns, job.metadata.name, succeeded=True)
    wait_for(lambda: api.status(ns, "m").get("phase") == "Failed", what="phase Failed")
    cond = api.condition(ns, "m", "ChildrenReconciled")
    assert (
        cond["status"] == "False" and cond["reason"] == "ChildRejected" and "Deployment m" in cond["message"]
    )
    assert api.condition(ns, "m", "Ready")["status"] == "False"
    (event,) = wait_for(lambda: api.events(ns, "ChildRejected"), what="a ChildRejected Event")
    assert event.type == "Warning" and "cpu" in event.message
    patch_spec(api, ns, "m", {"resources": {"requests": {"cpu": "4"}}})
    wait_for(lambda: api.deployment(ns, "m"), what="the Deployment once the spec is fixed")
    wait_for(lambda: api.condition(ns, "m", "ChildrenReconciled")["status"] == "True", what="recovered")


def test_scale_reaches_the_serving_deployment_while_blocked(
    cluster: Cluster, api: Api, operator: Any, ns: str
) -> None:
    verified_deployment(api, ns, "m", copy.deepcopy(SAMPLE))
    patch_spec(api, ns, "m", {"model": {"artifact": {"sha256": BAD_SHA}}})
    job = wait_for(
        lambda: next((j for j in api.jobs(ns, "m") if BAD_SHA[:12] in j.metadata.name), None), what="Job"
    )
    api.finish_job(ns, job.metadata.name, succeeded=False)
    wait_for(lambda: api.status(ns, "m").get("phase") == "Blocked", what="phase Blocked")
    cluster.kubectl("scale", "-n", ns, "ninferdeployment/m", "--replicas=3")
    wait_for(lambda: api.deployment(ns, "m").spec.replicas == 3, what="the old ReplicaSet scaled to 3")
    assert BAD_SHA not in api.deployment_args(ns, "m"), "scaling must not roll out the blocked digest"


def test_status_counts_follow_the_deployment_without_waiting_for_the_resync(
    api: Api, operator: Any, ns: str
) -> None:
    started = time.monotonic()
    verified_deployment(api, ns, "m", copy.deepcopy(SAMPLE))
    # the ReplicaSet controller creates 2 pods (Pending: no kubelet); Deployment status -> the resource status
    wait_for(lambda: api.status(ns, "m").get("replicas") == 2, timeout=RESYNC_S - 5, what="status.replicas 2")
    assert time.monotonic() - started < RESYNC_S


def test_zero_replicas_is_not_ready(api: Api, operator: Any, ns: str) -> None:
    spec = copy.deepcopy(SAMPLE)
    spec["replicas"] = 0
    verified_deployment(api, ns, "m", spec)
    wait_for(lambda: api.status(ns, "m").get("phase") == "ScaledToZero", what="phase ScaledToZero")
    ready = api.condition(ns, "m", "Ready")
    assert ready["status"] == "False" and ready["reason"] == "ScaledToZero"


def test_a_missing_file_is_not_reported_as_a_digest_mismatch(api: Api, operator: Any, ns: str) -> None:
    create_cr(api, ns, "m", copy.deepcopy(SAMPLE))
    (job,) = wait_for(lambda: api.jobs(ns, "m"), what="the verification Job")
    missing = "ninfer-artifact verify: [Errno 2] No such file or directory: '/artifacts/qwen3.6-27b.ninfer'"
    api.finish_job(ns, job.metadata.name, succeeded=False, message=missing)
    cond = wait_for(
        lambda: (c := api.condition(ns, "m", "ArtifactVerified")) and c["status"] == "False" and c,
        what="ArtifactVerified=False",
    )
    assert cond["reason"] == "ArtifactMissing" and "No such file" in cond["message"]
    assert api.events(ns, "ArtifactMissing") and not api.events(ns, "DigestMismatch")


def test_a_pair_of_modes_the_server_refuses_is_invalid_with_a_reason_and_no_pod(
    api: Api, operator: Any, ns: str
) -> None:
    """Every mode is supported alone; speculative decoding with vision is a pair ninfer-serve refuses, so the
    operator refuses it before any Job or pod (a pod would exit at start)."""
    spec = copy.deepcopy(SAMPLE)
    spec["engine"]["spec"] = {"mode": "mtp", "draftTokens": 3}
    spec["engine"]["vision"] = True
    create_cr(api, ns, "m", spec)
    wait_for(lambda: api.status(ns, "m").get("phase") == "Invalid", what="phase Invalid")
    message = api.condition(ns, "m", "Ready")["message"]
    assert "engine.vision" in message and "text only" in message
    assert not api.jobs(ns, "m") and api.deployment(ns, "m") is None
    (event,) = wait_for(lambda: api.events(ns, "InvalidSpec"), what="an InvalidSpec Event")
    assert event.type == "Warning"


def test_resources_on_one_artifact_share_one_verification_job(api: Api, operator: Any, ns: str) -> None:
    for name in ("a", "b", "c"):
        create_cr(api, ns, name, copy.deepcopy(SAMPLE))
    (job,) = wait_for(
        lambda: (jobs := api.jobs(ns)) and len(jobs[0].metadata.owner_references or []) == 3 and jobs,
        what="one Job owned by all three",
    )
    assert len(api.jobs(ns)) == 1
    api.finish_job(ns, job.metadata.name, succeeded=True)
    for name in ("a", "b", "c"):
        wait_for(lambda n=name: api.deployment(ns, n), what=f"Deployment {name}")


def test_production_settings_reach_the_pods(api: Api, operator: Any, ns: str) -> None:
    spec = copy.deepcopy(SAMPLE)
    spec.update(imagePullSecrets=[{"name": "regcred"}], apiKeySecret={"name": "ninfer-key"})
    dep = verified_deployment(api, ns, "m", spec)
    pod = dep.spec.template.spec
    assert pod.image_pull_secrets[0].name == "regcred"
    server = next(c for c in pod.containers if c.name == "server")
    assert server.env[0].value_from.secret_key_ref.name == "ninfer-key"
    assert server.env[0].name == "NINFER_API_KEY" and "--api-key" not in server.command
    assert "--request-log-max-mib" in server.command and "--shutdown-timeout-s" in server.command


def test_resources_carry_no_finalizer_so_uninstalling_the_operator_first_leaves_nothing_stuck(
    api: Api, operator: Any, ns: str
) -> None:
    verified_deployment(api, ns, "m", copy.deepcopy(SAMPLE))
    assert not api.cr(ns, "m")["metadata"].get("finalizers")
