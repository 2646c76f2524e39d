"""Pure renders: an `NInferDeployment` spec -> the workload manifests the operator owns.

Nothing here talks to the API server; every function takes plain mappings and returns plain dicts,
so tests check them without a cluster. Owner references are added by the handlers (`kopf.adopt`).
Child names come from names.py (always valid); the spec -> flag mapping is flags.py; the Service and the
routing objects (InferencePool, HTTPRoute, legacy Ingress) are routing.py.

Children of `NInferDeployment/<name>` (`<base>` = names.base_name(name)):
  Job        ninfer-verify-<sha12>-<urihash>  runs `ninfer-artifact verify` on a target node (the gate); shared
                                              by every resource of the namespace with that (uri, sha256)
  ConfigMap  <base>-model                     model identity (model.json), mounted at /etc/ninfer
  Deployment <base>                           ninfer-serve (+ ninfer-monitor sidecar)
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import flags, names, routing
from .placement import GPU_PRODUCT_LABEL, GPU_RESOURCE, gpu_products

Manifest = dict[str, Any]
Spec = Mapping[str, Any]

SERVER_PORT = flags.SERVER_PORT
MONITOR_PORT = routing.MONITOR_PORT
RUN_AS_USER = 10001  # the Dockerfile's `ninfer` user
ARTIFACT_DIR = "/artifacts"
LOG_DIR = "/var/log/ninfer"
REQUEST_LOG = f"{LOG_DIR}/requests.jsonl"
CONFIG_DIR = "/etc/ninfer"
BASE_MEMORY_MIB = 8192  # tokenizer, API process, pinned staging buffers; host KV parking adds to it
SHA_ANNOTATION = "ninfer.io/sha256"
URI_ANNOTATION = "ninfer.io/artifact-uri"
INSTANCE_LABEL = "ninfer.io/deployment"
ROLE_LABEL = "ninfer.io/role"
VERIFY_KEY_LABEL = "ninfer.io/verify-key"
MANAGED_BY = "ninfer-operator"
DEFAULT_DRAIN_S = flags.DEFAULT_DRAIN_S
DRAIN_MARGIN_S = 15  # uvicorn's own shutdown after the last stream

# Startup probe budget: weights stream from local disk at >= ~250 MB/s; plus graph capture and warmup.
STARTUP_PERIOD_S = 10
STARTUP_FIXED_S = 300
STARTUP_BYTES_PER_S = 250_000_000
STARTUP_MIN_FAILURES = 60  # 10 minutes
STARTUP_MAX_FAILURES = 720  # 2 hours
STARTUP_UNKNOWN_SIZE_FAILURES = 180  # 30 minutes when sizeBytes is not given


# ---------------------------------------------------------------------------------------------- spec


DRAFT_LIMITS = {
    "mtp": 5,
    "dflash": 15,
}  # engine.config.MAX_DRAFT_TOKENS (the operator imports no engine code)


def validate_spec(name: str, spec: Spec) -> list[str]:
    """Rules the CRD schema cannot state on Kubernetes 1.20 (no CEL), plus the name. Empty = valid."""
    errors: list[str] = names.name_errors(name)
    engine = spec.get("engine") or {}
    spec_dec = engine.get("spec") or {}
    mode, draft = spec_dec.get("mode", "off"), spec_dec.get("draftTokens")
    if draft is not None and mode not in DRAFT_LIMITS:
        errors.append("engine.spec.draftTokens is set but engine.spec.mode is not 'mtp' or 'dflash'")
    elif draft is not None and not 1 <= int(draft) <= DRAFT_LIMITS[mode]:
        errors.append(
            f"engine.spec.draftTokens must be 1..{DRAFT_LIMITS[mode]} for mode {mode!r}, got {draft}"
        )
    if mode == "dflash" and engine.get("hostKvCacheMiB"):
        errors.append(
            "engine.spec.mode 'dflash' cannot be combined with engine.hostKvCacheMiB (host parking)"
        )
    if mode != "off" and engine.get("vision"):
        errors.append(
            f"engine.vision cannot be combined with engine.spec.mode {mode!r} (ninfer-serve refuses --vision "
            "with --spec: speculative decoding is text only)"
        )
    kv, ctx = engine.get("kvCapacity"), engine.get("maxContext")
    if kv is not None and str(kv) != "auto" and (not str(kv).isdigit() or int(kv) < 1):
        errors.append(f"engine.kvCapacity must be 'auto' or a positive token count, got {kv!r}")
        kv = None
    if kv is not None and str(kv) != "auto" and ctx is not None and int(kv) < int(ctx):
        errors.append(f"engine.kvCapacity ({kv}) must be >= engine.maxContext ({ctx})")
    if engine.get("prefixReuse", True) is False and engine.get("hostKvCacheMiB"):
        errors.append(
            "engine.hostKvCacheMiB needs prefix reuse; it cannot be combined with prefixReuse: false"
        )
    artifact = ((spec.get("model") or {}).get("artifact")) or {}
    if not artifact.get("uri") or not artifact.get("sha256"):
        errors.append("model.artifact.uri and model.artifact.sha256 are required")
    return errors + flags.extra_args_errors(spec) + routing.routing_errors(spec)


def artifact_of(spec: Spec) -> tuple[str, str]:
    artifact = spec["model"]["artifact"]
    return str(artifact["uri"]), str(artifact["sha256"])


@dataclass(frozen=True)
class ArtifactMount:
    volume: Manifest
    mount: Manifest
    path: str  # the artifact file as the containers see it


def artifact_mount(uri: str) -> ArtifactMount:
    """Mount the artifact read-only. `pvc://claim/path` mounts the claim; `file:///p` the node's file."""
    if uri.startswith("pvc://"):
        claim, _, rel = uri[len("pvc://") :].partition("/")
        volume = {"name": "artifact", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        return ArtifactMount(
            volume, {"name": "artifact", "mountPath": ARTIFACT_DIR, "readOnly": True}, f"{ARTIFACT_DIR}/{rel}"
        )
    if uri.startswith("file:///"):
        host_path = uri[len("file://") :]
        path = f"{ARTIFACT_DIR}/{host_path.rsplit('/', 1)[-1]}"
        volume = {"name": "artifact", "hostPath": {"path": host_path, "type": "File"}}
        return ArtifactMount(volume, {"name": "artifact", "mountPath": path, "readOnly": True}, path)
    raise ValueError(f"unsupported artifact uri {uri!r}: expected pvc://CLAIM/PATH or file:///PATH")


def server_args(spec: Spec, artifact_path: str) -> list[str]:
    """`ninfer-serve` command line, from flags.FLAG_TABLE (the one spec -> flag table)."""
    return flags.server_args(
        spec, artifact_path, REQUEST_LOG, inference_pool=routing.uses_inference_pool(spec)
    )


# ----------------------------------------------------------------------------------------- placement


def labels(name: str) -> dict[str, str]:
    base = names.base_name(name)
    return {
        "app.kubernetes.io/name": "ninfer",
        "app.kubernetes.io/instance": base,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        INSTANCE_LABEL: base,
    }


def selector(name: str) -> dict[str, str]:
    return {INSTANCE_LABEL: names.base_name(name), ROLE_LABEL: "server"}


def selector_string(name: str) -> str:
    return ",".join(f"{k}={v}" for k, v in selector(name).items())


def affinity(spec: Spec) -> Manifest:
    term = {
        "matchExpressions": [
            {"key": GPU_PRODUCT_LABEL, "operator": "In", "values": gpu_products(spec.get("placement") or {})}
        ]
    }
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def tolerations(spec: Spec) -> list[Manifest]:
    """The GPU taint (`nvidia.com/gpu`, as the GPU operator and cloud GPU pools set it) plus the user's."""
    out: list[Manifest] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    for tol in (spec.get("placement") or {}).get("tolerations") or []:
        if dict(tol) not in out:
            out.append(dict(tol))
    return out


def placement_fields(spec: Spec) -> Manifest:
    """Pod-spec fields shared by the server pods and the verification Job: same nodes, same taints."""
    fields: Manifest = {"affinity": affinity(spec), "tolerations": tolerations(spec)}
    node_selector = (spec.get("placement") or {}).get("nodeSelector")
    if node_selector:
        fields["nodeSelector"] = dict(node_selector)
    return fields


def container_security() -> Manifest:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def pod_security() -> Manifest:
    return {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER, "fsGroup": RUN_AS_USER}


def image_of(spec: Spec, default_image: str) -> str:
    return str(spec.get("image") or default_image)


def pull_secrets(spec: Spec) -> Manifest:
    secrets = [{"name": str(s["name"])} for s in spec.get("imagePullSecrets") or []]
    return {"imagePullSecrets": secrets} if secrets else {}


# -------------------------------------------------------------------------------------- verification


def verify_key(sha: str, uri: str) -> str:
    return f"{sha[:12]}-{hashlib.sha256(uri.encode()).hexdigest()[:5]}"


def verify_job_name(sha: str, uri: str) -> str:
    """One Job per (digest, uri) in a namespace, whichever resources ask for it (<= 63 chars: pod label)."""
    return f"ninfer-verify-{verify_key(sha, uri)}"


def render_verify_job(spec: Spec, default_image: str) -> Manifest:
    uri, sha = artifact_of(spec)
    mount = artifact_mount(uri)
    job_labels = {
        "app.kubernetes.io/name": "ninfer",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        ROLE_LABEL: "verify",
        VERIFY_KEY_LABEL: verify_key(sha, uri),
    }
    container = {
        "name": "verify",
        "image": image_of(spec, default_image),
        "command": ["ninfer-artifact", "verify", mount.path, "--sha256", sha],
        "volumeMounts": [mount.mount],
        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": container_security(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    # NOTE: no GPU request: on one-GPU nodes the serving pod holds the GPU, and hashing needs none.
    pod_spec = {
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": [mount.volume],
        "securityContext": pod_security(),
        "automountServiceAccountToken": False,
        **pull_secrets(spec),
        **placement_fields(spec),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": verify_job_name(sha, uri),
            "labels": job_labels,
            "annotations": {SHA_ANNOTATION: sha, URI_ANNOTATION: uri},
        },
        "spec": {
            "backoffLimit": 0,  # a digest mismatch does not heal on retry
            "activeDeadlineSeconds": 7200,
            "template": {"metadata": {"labels": job_labels}, "spec": pod_spec},
        },
    }


def failure_reason(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """(reason, detail) of a failed verification Job, from its pod's termination message (stderr) or the
    Job's own condition: DigestMismatch | ArtifactMissing | VerificationTimedOut | VerificationFailed."""
    text = ""
    for pod in pods:
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (status.get("state") or {}).get("terminated") or {}
            text = str(terminated.get("message") or "").strip() or text
    cond: Mapping[str, Any] = next(
        (c for c in (job.get("status") or {}).get("conditions") or [] if c.get("type") == "Failed"), {}
    )
    last = text.splitlines()[-1] if text else str(cond.get("message") or "")
    if "MISMATCH" in text:
        return "DigestMismatch", last
    if "No such file" in text or "FileNotFoundError" in text or "IsADirectory" in text:
        return "ArtifactMissing", last
    if cond.get("reason") == "DeadlineExceeded":
        return "VerificationTimedOut", last
    return "VerificationFailed", last or "the verification Job failed"


def job_state(job: Mapping[str, Any]) -> str:
    """'succeeded' | 'failed' | 'running', read the way the job controller reports it."""
    status = job.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") == "Complete":
            return "succeeded"
        if cond.get("status") == "True" and cond.get("type") == "Failed":
            return "failed"
    return "running"


# ------------------------------------------------------------------------------------------- serving


def startup_failure_threshold(size_bytes: int | None) -> int:
    """Startup-probe failures allowed (period STARTUP_PERIOD_S), sized for loading `size_bytes`."""
    if not size_bytes:
        return STARTUP_UNKNOWN_SIZE_FAILURES
    budget_s = STARTUP_FIXED_S + size_bytes / STARTUP_BYTES_PER_S
    return max(STARTUP_MIN_FAILURES, min(STARTUP_MAX_FAILURES, math.ceil(budget_s / STARTUP_PERIOD_S)))


def memory_mib(spec: Spec) -> int:
    return BASE_MEMORY_MIB + int((spec.get("engine") or {}).get("hostKvCacheMiB") or 0)


def mib_quantity(mib: int) -> str:
    """A MiB count in the API server's canonical form (8192 -> "8Gi"), so live and rendered compare equal."""
    for suffix in ("Mi", "Gi", "Ti"):
        if mib % 1024 or suffix == "Ti":
            return f"{mib}{suffix}"
        mib //= 1024
    raise AssertionError("unreachable")


def _http_probe(path: str, port: str, period: int, failures: int) -> Manifest:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def merged_resources(spec: Spec, defaults: Manifest) -> Manifest:
    """spec.resources over the defaults, key by key (a GPU count set there wins over placement.gpuCount)."""
    override = spec.get("resources") or {}
    return {part: {**defaults.get(part, {}), **(override.get(part) or {})} for part in ("requests", "limits")}


def server_env(spec: Spec) -> list[Manifest]:
    secret = spec.get("apiKeySecret") or {}
    if not secret.get("name"):
        return []
    ref = {"name": str(secret["name"]), "key": str(secret.get("key") or "api-key")}
    return [{"name": flags.API_KEY_ENV, "valueFrom": {"secretKeyRef": ref}}]


def server_container(spec: Spec, default_image: str, mount: ArtifactMount) -> Manifest:
    gpus = str((spec.get("placement") or {}).get("gpuCount") or 1)
    memory = mib_quantity(memory_mib(spec))
    size = ((spec.get("model") or {}).get("artifact") or {}).get("sizeBytes")
    defaults = {
        "requests": {"cpu": "2", "memory": memory, GPU_RESOURCE: gpus},
        "limits": {"memory": memory, GPU_RESOURCE: gpus},
    }
    container: Manifest = {
        "name": "server",
        "image": image_of(spec, default_image),
        "command": server_args(spec, mount.path),
        "ports": [{"name": "http", "containerPort": SERVER_PORT, "protocol": "TCP"}],
        "resources": merged_resources(spec, defaults),
        # /health answers once uvicorn listens (after the load); /ready is 503 while warming up and while
        # draining, so a stopping or cold replica leaves the Service and the InferencePool first.
        "startupProbe": _http_probe("/health", "http", STARTUP_PERIOD_S, startup_failure_threshold(size)),
        "readinessProbe": _http_probe("/ready", "http", 5, 2),
        "livenessProbe": _http_probe("/health", "http", 20, 6),
        "volumeMounts": [
            mount.mount,
            {"name": "request-log", "mountPath": LOG_DIR},
            {"name": "model-config", "mountPath": CONFIG_DIR, "readOnly": True},
        ],
        "securityContext": container_security(),
    }
    env = server_env(spec)
    if env:
        container["env"] = env
    return container


def monitor_container(spec: Spec, default_image: str) -> Manifest:
    monitoring = spec.get("monitoring") or {}
    return {
        "name": "monitor",
        "image": str(monitoring.get("image") or image_of(spec, default_image)),
        "command": [
            "ninfer-monitor",
            "--bind",
            "0.0.0.0",
            "--port",
            str(MONITOR_PORT),
            "--server-url",
            f"http://127.0.0.1:{SERVER_PORT}",
            "--jsonl",
            REQUEST_LOG,
        ],
        "ports": [{"name": "monitor", "containerPort": MONITOR_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        "readinessProbe": _http_probe("/healthz", "monitor", 10, 3),
        "volumeMounts": [
            {"name": "request-log", "mountPath": LOG_DIR, "readOnly": True},
            {"name": "model-config", "mountPath": CONFIG_DIR, "readOnly": True},
        ],
        "securityContext": container_security(),
    }


def sidecar_enabled(spec: Spec) -> bool:
    return bool((spec.get("monitoring") or {}).get("sidecar", True))


def progress_deadline_s(spec: Spec) -> int:
    size = ((spec.get("model") or {}).get("artifact") or {}).get("sizeBytes")
    return max(1800, startup_failure_threshold(size) * STARTUP_PERIOD_S + 600)


def termination_grace_s(spec: Spec) -> int:
    """The server drains on SIGTERM for --shutdown-timeout-s (new requests 503, /ready 503, admitted streams
    finish); the kubelet kills it after this long: the same drain budget plus uvicorn's own shutdown."""
    return flags.drain_seconds(spec) + DRAIN_MARGIN_S


def render_deployment(name: str, spec: Spec, default_image: str) -> Manifest:
    uri, sha = artifact_of(spec)
    mount = artifact_mount(uri)
    containers = [server_container(spec, default_image, mount)]
    if sidecar_enabled(spec):
        containers.append(monitor_container(spec, default_image))
    pod_labels = {**labels(name), **selector(name)}
    weights_id = (spec.get("model") or {}).get("weightsId")
    annotations = {SHA_ANNOTATION: sha, URI_ANNOTATION: uri}
    if weights_id:
        annotations["ninfer.io/weights-id"] = str(weights_id)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": names.child_name(name), "labels": {**labels(name), ROLE_LABEL: "server"}},
        "spec": {
            "replicas": int(spec.get("replicas", 1)),
            "selector": {"matchLabels": selector(name)},
            # One GPU per node: a surge pod would have nowhere to go, so replace one replica at a time.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "progressDeadlineSeconds": progress_deadline_s(spec),
            "revisionHistoryLimit": 5,
            "template": {
                "metadata": {"labels": pod_labels, "annotations": annotations},
                "spec": {
                    "containers": containers,
                    "volumes": [
                        mount.volume,
                        {
                            "name": "request-log",
                            "emptyDir": {"sizeLimit": mib_quantity(flags.REQUEST_LOG_VOLUME_MIB)},
                        },
                        {"name": "model-config", "configMap": {"name": config_map_name(name)}},
                    ],
                    "securityContext": pod_security(),
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": termination_grace_s(spec),
                    **pull_secrets(spec),
                    **placement_fields(spec),
                },
            },
        },
    }


def config_map_name(name: str) -> str:
    return names.child_name(name, "model")


def render_config_map(name: str, spec: Spec) -> Manifest:
    model = spec.get("model") or {}
    data = {
        "modelId": model.get("modelId"),
        "weightsId": model.get("weightsId"),
        "artifact": dict(model.get("artifact") or {}),
        "engine": dict(spec.get("engine") or {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": config_map_name(name), "labels": labels(name)},
        "data": {"model.json": json.dumps(data, sort_keys=True, default=str)},
    }


def serving_sha(deployment: Mapping[str, Any] | None) -> str | None:
    """The digest the Deployment's pod template serves, or None without a Deployment."""
    if not deployment:
        return None
    meta = ((deployment.get("spec") or {}).get("template") or {}).get("metadata") or {}
    return (meta.get("annotations") or {}).get(SHA_ANNOTATION)
