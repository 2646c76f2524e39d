"""Render unit tests for operator/ninfer_operator (no cluster): spec -> Job, Deployment, Service, ..."""

from __future__ import annotations

from typing import Any

import pytest
from ninfer_operator import conditions, placement, resources, routing
from ninfer_operator.kube import is_subset
from operator_samples import GOOD_SHA

IMAGE = "default/ninfer:0"


def _service(spec: dict[str, Any]) -> dict[str, Any]:
    return routing.render_service("m", spec, resources.labels("m"), resources.selector("m"))


def _containers(dep: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in dep["spec"]["template"]["spec"]["containers"]}


def test_every_engine_field_maps_to_exactly_one_upstream_flag(sample_spec: dict[str, Any]) -> None:
    args = resources.server_args(sample_spec, "/artifacts/m.ninfer")
    assert args[:2] == ["ninfer-serve", "/artifacts/m.ninfer"]
    expected = {
        "--max-context": "131072",
        "--kv-capacity": "auto",
        "--max-concurrency": "4",
        "--host-kv-cache-mib": "16384",
        "--kv-dtype": "int8",
        "--model-id": "qwen3.6-27b",
        "--expected-sha256": GOOD_SHA,
        "--port": "8080",
        "--request-log-max-mib": "256",
        "--request-log-keep": "4",
    }
    for flag, value in expected.items():
        assert args.count(flag) == 1, flag
        assert args[args.index(flag) + 1] == value, flag
    assert "--metrics-vllm-aliases" in args, "an InferencePool's endpoint picker reads the vllm: names"
    for flag in ("--vision", "--spec", "--draft-tokens", "--no-prefix-reuse", "--api-key"):
        assert flag not in args


def test_disabled_features_render_no_flags(sample_spec: dict[str, Any]) -> None:
    sample_spec["engine"] = {"prefixReuse": False, "vision": False, "spec": {"mode": "off"}}
    del sample_spec["routing"]
    args = resources.server_args(sample_spec, "/a")
    assert "--no-prefix-reuse" in args
    for flag in (
        "--vision",
        "--spec",
        "--draft-tokens",
        "--max-context",
        "--kv-capacity",
        "--host-kv-cache-mib",
        "--metrics-vllm-aliases",
    ):
        assert flag not in args


@pytest.mark.parametrize(
    ("engine", "needle"),
    [
        ({"spec": {"mode": "off", "draftTokens": 2}}, "draftTokens"),
        ({"spec": {"mode": "mtp", "draftTokens": 7}}, "1..5"),
        ({"spec": {"mode": "dflash", "draftTokens": 16}}, "1..15"),
        ({"spec": {"mode": "dflash"}, "hostKvCacheMiB": 1024}, "host parking"),
        ({"spec": {"mode": "dflash"}, "vision": True}, "text only"),
        ({"spec": {"mode": "mtp"}, "vision": True}, "text only"),
        ({"maxContext": 4096, "kvCapacity": 1024}, "kvCapacity"),
        ({"prefixReuse": False, "hostKvCacheMiB": 1024}, "hostKvCacheMiB"),
    ],
)
def test_cross_field_rules_reject_bad_specs(
    sample_spec: dict[str, Any], engine: dict[str, Any], needle: str
) -> None:
    sample_spec["engine"] = engine
    errors = resources.validate_spec("m", sample_spec)
    assert len(errors) == 1 and needle in errors[0]


def test_valid_sample_has_no_errors(sample_spec: dict[str, Any]) -> None:
    assert resources.validate_spec("m", sample_spec) == []
    sample_spec["engine"] = {"maxContext": 4096, "kvCapacity": 4096}
    assert resources.validate_spec("m", sample_spec) == []


def test_extra_args_pass_verbatim_but_may_not_repeat_a_table_flag(sample_spec: dict[str, Any]) -> None:
    sample_spec["engine"]["extraArgs"] = ["--prefill-chunk", "2048", "--no-thinking"]
    assert resources.server_args(sample_spec, "/a")[-3:] == ["--prefill-chunk", "2048", "--no-thinking"]
    assert resources.validate_spec("m", sample_spec) == []
    sample_spec["engine"]["extraArgs"] = ["--max-context=4096", "--port", "1"]
    errors = resources.validate_spec("m", sample_spec)
    assert len(errors) == 2 and "--max-context" in errors[0] and "--port" in errors[1]


def test_deployment_places_on_gpu_product_with_shared_form_and_gpu_limits(
    sample_spec: dict[str, Any],
) -> None:
    sample_spec["placement"] = {
        "gpuProduct": ["NVIDIA-GeForce-RTX-5090"],
        "gpuCount": 2,
        "nodeSelector": {"pool": "gpu"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
    }
    pod = resources.render_deployment("m", sample_spec, IMAGE)["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [
        {
            "matchExpressions": [
                {
                    "key": "nvidia.com/gpu.product",
                    "operator": "In",
                    "values": ["NVIDIA-GeForce-RTX-5090", "NVIDIA-GeForce-RTX-5090-SHARED"],
                }
            ]
        }
    ]
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    server = _containers({"spec": {"template": {"spec": pod}}})["server"]
    assert server["resources"]["limits"]["nvidia.com/gpu"] == "2"
    # 8 GiB base + 16 GiB host KV parking, in the API server's canonical quantity form
    assert server["resources"]["limits"]["memory"] == "24Gi"


def test_default_gpu_product_is_the_rtx_5090(sample_spec: dict[str, Any]) -> None:
    del sample_spec["placement"]
    aff = resources.affinity(sample_spec)
    values = aff["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert values["matchExpressions"][0]["values"] == [
        "NVIDIA-GeForce-RTX-5090",
        "NVIDIA-GeForce-RTX-5090-SHARED",
    ]


def test_rollout_strategy_never_surges_and_probes_split_liveness_from_readiness(
    sample_spec: dict[str, Any],
) -> None:
    dep = resources.render_deployment("m", sample_spec, IMAGE)
    assert dep["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    assert dep["spec"]["progressDeadlineSeconds"] >= 1800
    server = _containers(dep)["server"]
    for probe in ("startupProbe", "livenessProbe"):
        assert server[probe]["httpGet"] == {"path": "/health", "port": "http"}
    # /ready is 503 while warming up and while draining: the replica leaves the endpoints, is not restarted
    assert server["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    pod = dep["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == resources.DEFAULT_DRAIN_S + resources.DRAIN_MARGIN_S
    assert server["command"][server["command"].index("--shutdown-timeout-s") + 1] == str(
        resources.DEFAULT_DRAIN_S
    )
    sample_spec["drainSeconds"] = 30
    dep = resources.render_deployment("m", sample_spec, IMAGE)
    pod = dep["spec"]["template"]["spec"]
    # the kubelet's deadline is the server's drain plus its own shutdown
    assert pod["terminationGracePeriodSeconds"] == 30 + resources.DRAIN_MARGIN_S
    args = _containers(dep)["server"]["command"]
    assert args[args.index("--shutdown-timeout-s") + 1] == "30"
    startup = server["startupProbe"]
    # 20 GB at 250 MB/s = 80 s + 300 s fixed -> 38 periods, raised to the 10-minute floor
    assert startup["failureThreshold"] * startup["periodSeconds"] >= 600
    assert dep["spec"]["progressDeadlineSeconds"] > startup["failureThreshold"] * startup["periodSeconds"]


def test_startup_budget_grows_with_artifact_size_within_bounds() -> None:
    small = resources.startup_failure_threshold(1_000_000)
    big = resources.startup_failure_threshold(400_000_000_000)  # 400 GB: 1600 s + 300 s
    assert small == resources.STARTUP_MIN_FAILURES
    assert big == 190
    assert resources.startup_failure_threshold(10**15) == resources.STARTUP_MAX_FAILURES
    assert resources.startup_failure_threshold(None) == resources.STARTUP_UNKNOWN_SIZE_FAILURES


def test_monitor_sidecar_shares_the_request_log_volume(sample_spec: dict[str, Any]) -> None:
    dep = resources.render_deployment("m", sample_spec, IMAGE)
    cs = _containers(dep)
    server_log = next(m for m in cs["server"]["volumeMounts"] if m["name"] == "request-log")
    monitor_log = next(m for m in cs["monitor"]["volumeMounts"] if m["name"] == "request-log")
    assert server_log["mountPath"] == monitor_log["mountPath"] == resources.LOG_DIR
    assert monitor_log["readOnly"] is True
    assert cs["monitor"]["command"][0] == "ninfer-monitor"
    assert resources.REQUEST_LOG in cs["monitor"]["command"]
    assert resources.REQUEST_LOG in cs["server"]["command"]
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert volumes["request-log"]["emptyDir"] == {"sizeLimit": "2Gi"}
    # rotation keeps the log below the volume: (keep + the live file) x max MiB < sizeLimit
    args = cs["server"]["command"]
    keep, max_mib = (
        int(args[args.index("--request-log-keep") + 1]),
        int(args[args.index("--request-log-max-mib") + 1]),
    )
    assert (keep + 1) * max_mib < 2048
    svc_ports = {p["name"] for p in _service(sample_spec)["spec"]["ports"]}
    assert svc_ports == {"http", "monitor"}


def test_sidecar_can_be_turned_off(sample_spec: dict[str, Any]) -> None:
    sample_spec["monitoring"] = {"sidecar": False}
    assert set(_containers(resources.render_deployment("m", sample_spec, IMAGE))) == {"server"}
    assert [p["name"] for p in _service(sample_spec)["spec"]["ports"]] == ["http"]


def test_pod_template_names_the_digest_and_runs_as_non_root(sample_spec: dict[str, Any]) -> None:
    dep = resources.render_deployment("m", sample_spec, IMAGE)
    assert resources.serving_sha(dep) == GOOD_SHA
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert (
        dep["spec"]["selector"]["matchLabels"].items()
        <= dep["spec"]["template"]["metadata"]["labels"].items()
    )
    assert _containers(dep)["server"]["image"] == "registry.example/ninfer-server:1"


def test_verify_job_runs_the_verifier_on_target_nodes_without_a_gpu(sample_spec: dict[str, Any]) -> None:
    job = resources.render_verify_job(sample_spec, IMAGE)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == [
        "ninfer-artifact",
        "verify",
        "/artifacts/qwen3.6-27b.ninfer",
        "--sha256",
        GOOD_SHA,
    ]
    assert pod["volumes"] == [
        {"name": "artifact", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}
    ]
    assert "nvidia.com/gpu" not in str(container["resources"])
    dep_pod = resources.render_deployment("m", sample_spec, IMAGE)["spec"]["template"]["spec"]
    assert pod["affinity"] == dep_pod["affinity"] and pod["tolerations"] == dep_pod["tolerations"]
    assert job["spec"]["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"
    assert len(job["metadata"]["name"]) <= 63


def test_verify_job_name_is_shared_per_digest_and_uri() -> None:
    a = resources.verify_job_name(GOOD_SHA, "pvc://c/a")
    assert a == resources.verify_job_name(GOOD_SHA, "pvc://c/a") and len(a) <= 63
    assert a != resources.verify_job_name("c" * 64, "pvc://c/a")
    assert a != resources.verify_job_name(GOOD_SHA, "pvc://c/b")


def test_a_failed_verification_names_its_reason() -> None:
    def pod(message: str) -> dict[str, Any]:
        return {
            "status": {"containerStatuses": [{"state": {"terminated": {"exitCode": 1, "message": message}}}]}
        }

    failed = {
        "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}
    }
    mismatch = "abc  /artifacts/m\nverify: MISMATCH for /artifacts/m\n  expected a\n  actual   b"
    assert resources.failure_reason(failed, [pod(mismatch)])[0] == "DigestMismatch"
    missing = "ninfer-artifact verify: [Errno 2] No such file or directory: '/artifacts/m'"
    assert resources.failure_reason(failed, [pod(missing)]) == ("ArtifactMissing", missing)
    timed_out = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
                                            "message": "Job was active longer than specified deadline"}]}}  # fmt: skip
    assert resources.failure_reason(timed_out, [])[0] == "VerificationTimedOut"
    assert resources.failure_reason(failed, [pod("Killed")]) == ("VerificationFailed", "Killed")


def test_production_settings_reach_the_pod(sample_spec: dict[str, Any]) -> None:
    sample_spec["imagePullSecrets"] = [{"name": "regcred"}]
    sample_spec["apiKeySecret"] = {"name": "ninfer-key"}
    sample_spec["resources"] = {"requests": {"cpu": "8"}, "limits": {"memory": "64Gi"}}
    dep = resources.render_deployment("m", sample_spec, IMAGE)
    pod = dep["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert resources.render_verify_job(sample_spec, IMAGE)["spec"]["template"]["spec"][
        "imagePullSecrets"
    ] == [{"name": "regcred"}]
    server = _containers(dep)["server"]
    assert server["env"] == [
        {"name": "NINFER_API_KEY", "valueFrom": {"secretKeyRef": {"name": "ninfer-key", "key": "api-key"}}}
    ]
    args = server["command"]
    assert "--api-key" not in args and "ninfer-key" not in str(args)  # the server reads $NINFER_API_KEY
    assert server["resources"]["requests"] == {"cpu": "8", "memory": "24Gi", "nvidia.com/gpu": "1"}
    assert server["resources"]["limits"] == {"memory": "64Gi", "nvidia.com/gpu": "1"}


def test_host_file_artifact_mounts_the_file_read_only() -> None:
    mount = resources.artifact_mount("file:///var/lib/ninfer/q.ninfer")
    assert mount.volume == {
        "name": "artifact",
        "hostPath": {"path": "/var/lib/ninfer/q.ninfer", "type": "File"},
    }
    assert mount.path == "/artifacts/q.ninfer" and mount.mount["readOnly"] is True
    with pytest.raises(ValueError, match="unsupported"):
        resources.artifact_mount("https://example.com/q.ninfer")


def test_job_state_reads_job_controller_conditions() -> None:
    assert resources.job_state({"status": {}}) == "running"
    assert (
        resources.job_state({"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
        == "succeeded"
    )
    assert resources.job_state({"status": {"conditions": [{"type": "Failed", "status": "True"}]}}) == "failed"


def test_config_map_carries_model_identity(sample_spec: dict[str, Any]) -> None:
    import json

    cm = resources.render_config_map("m", sample_spec)
    data = json.loads(cm["data"]["model.json"])
    assert data["artifact"]["sha256"] == GOOD_SHA and data["modelId"] == "qwen3.6-27b"


def test_mib_quantity_is_canonical() -> None:
    assert [resources.mib_quantity(n) for n in (8192, 8704, 1024 * 1024, 1536)] == [
        "8Gi",
        "8704Mi",
        "1Ti",
        "1536Mi",
    ]


def test_placement_condition_matches_shared_label_and_node_selector() -> None:
    nodes = [
        {"name": "a", "labels": {"nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-5090-SHARED", "pool": "x"}},
        {"name": "b", "labels": {"nvidia.com/gpu.product": "NVIDIA-H200"}},
    ]
    status, reason, _ = placement.placement_condition(nodes, {})
    assert (status, reason) == ("True", "NodesFound")
    status, reason, msg = placement.placement_condition(nodes, {"nodeSelector": {"pool": "y"}})
    assert (status, reason) == ("False", "NoMatchingNodes") and "Pending" in msg
    assert placement.placement_condition(nodes, {"gpuProduct": ["NVIDIA-H200"]})[0] == "True"


def test_set_condition_keeps_transition_time_unless_status_flips() -> None:
    c1 = conditions.set_condition([], "Ready", "False", "A", "m", 1, now="t1")
    c2 = conditions.set_condition(c1, "Ready", "False", "B", "m2", 2, now="t2")
    c3 = conditions.set_condition(c2, "Ready", "True", "C", "m3", 3, now="t3")
    assert c2[0]["lastTransitionTime"] == "t1" and c2[0]["reason"] == "B"
    assert c3[0]["lastTransitionTime"] == "t3" and c3[0]["observedGeneration"] == 3
    both = conditions.set_condition(c3, "ArtifactVerified", "True", "DigestMatch", "", 3, now="t4")
    assert [c["type"] for c in both] == ["ArtifactVerified", "Ready"]


def test_phase_roll_up() -> None:
    def conds(**kv: str) -> list[dict[str, Any]]:
        return [{"type": k, "status": v} for k, v in kv.items()]

    assert conditions.phase(conds(ArtifactVerified="Unknown")) == "Verifying"
    assert conditions.phase(conds(ArtifactVerified="False")) == "Blocked"
    assert conditions.phase(conds(ArtifactVerified="True", Ready="True")) == "Ready"
    assert conditions.phase(conds(ArtifactVerified="True", Ready="False", Progressing="False")) == "Degraded"
    assert (
        conditions.phase(conds(ArtifactVerified="True", Ready="False", Progressing="True")) == "Progressing"
    )
    invalid = [{"type": "Ready", "status": "False", "reason": "InvalidSpec"}]
    assert conditions.phase(invalid) == "Invalid"
    assert conditions.phase([{"type": "Ready", "status": "False", "reason": "Unsupported"}]) == "Unsupported"
    refused = conds(ArtifactVerified="True", ChildrenReconciled="False", Ready="False")
    assert conditions.phase(refused) == "Failed"
    unschedulable = conds(ArtifactVerified="True", PlacementSatisfiable="False", Ready="False")
    assert conditions.phase(unschedulable) == "Unschedulable"
    zero = [*conds(ArtifactVerified="True"), {"type": "Ready", "status": "False", "reason": "ScaledToZero"}]
    assert conditions.phase(zero) == "ScaledToZero"


def test_ready_requires_verified_current_and_all_replicas() -> None:
    verified = [{"type": "ArtifactVerified", "status": "True"}, {"type": "Available", "status": "True"}]
    counts = {"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2, "availableReplicas": 2, "desired": 2}
    assert conditions.ready_condition(verified, counts, True)[0] == "True"
    assert conditions.ready_condition(verified, counts, False)[1] == "RolloutPending"
    assert conditions.ready_condition(verified, {**counts, "readyReplicas": 1}, True)[1] == "ReplicasNotReady"
    assert conditions.ready_condition(verified[1:], counts, True)[1] == "ArtifactNotVerified"
    zero = {"replicas": 0, "readyReplicas": 0, "updatedReplicas": 0, "availableReplicas": 0, "desired": 0}
    assert conditions.ready_condition(verified, zero, True)[:2] == ("False", "ScaledToZero")


def test_is_subset_ignores_server_defaults_but_sees_drift() -> None:
    want = {"spec": {"replicas": 2, "ports": [{"port": 80}]}}
    live = {"spec": {"replicas": 2, "ports": [{"port": 80, "protocol": "TCP"}], "sessionAffinity": "None"}}
    assert is_subset(want, live)
    assert not is_subset(want, {"spec": {"replicas": 3, "ports": [{"port": 80}]}})
    assert not is_subset(want, {"spec": {"replicas": 2, "ports": []}})
