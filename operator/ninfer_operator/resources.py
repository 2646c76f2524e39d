"""Pure renders: an `NInferDeployment` spec -> the manifests the operator owns.

Nothing here talks to the API server; every function takes plain mappings and returns plain dicts,
so tests check them without a cluster. Owner references are added by the handlers (`kopf.adopt`).

Children of `NInferDeployment/<name>`:
  Job        <name>-verify-<sha12>-<urihash>  runs `ninfer-artifact verify` on a target node (gate)
  ConfigMap  <name>-model                     model identity (model.json), mounted at /etc/ninfer
  Deployment <name>                           ninfer-serve (+ ninfer-monitor sidecar)
  Service    <name>                           http 8080 (+ monitor 8090)
  Ingress    <name>                           only with routing.sessionHeader: consistent hashing on it
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .placement import GPU_PRODUCT_LABEL, GPU_RESOURCE, gpu_products

Manifest = dict[str, Any]
Spec = Mapping[str, Any]

SERVER_PORT = 8080
MONITOR_PORT = 8090
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

# spec.engine key -> ninfer-serve flag. Booleans are handled in server_args (prefixReuse is negated).
ENGINE_FLAGS: dict[str, str] = {
    "maxContext": "--max-context",
    "kvCapacity": "--kv-capacity",
    "maxConcurrency": "--max-concurrency",
    "hostKvCacheMiB": "--host-kv-cache-mib",
    "kvDtype": "--kv-dtype",
}

# Startup probe budget: weights stream from local disk at >= ~250 MB/s; plus graph capture and warmup.
STARTUP_PERIOD_S = 10
STARTUP_FIXED_S = 300
STARTUP_BYTES_PER_S = 250_000_000
STARTUP_MIN_FAILURES = 60  # 10 minutes
STARTUP_MAX_FAILURES = 720  # 2 hours
STARTUP_UNKNOWN_SIZE_FAILURES = 180  # 30 minutes when sizeBytes is not given


# ---------------------------------------------------------------------------------------------- spec


def validate_spec(spec: Spec) -> list[str]:
    """Cross-field rules the CRD schema cannot state on Kubernetes 1.20 (no CEL). Empty = valid."""
    errors: list[str] = []
    engine = spec.get("engine") or {}
    spec_dec = engine.get("spec") or {}
    if spec_dec.get("draftTokens") is not None and spec_dec.get("mode", "off") != "mtp":
        errors.append("engine.spec.draftTokens is set but engine.spec.mode is not 'mtp'")
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
    return errors


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
    """`ninfer-serve` command line; every spec.engine field maps to exactly one upstream flag."""
    _, sha = artifact_of(spec)
    args = ["ninfer-serve", artifact_path, "--host", "0.0.0.0", "--port", str(SERVER_PORT)]
    model_id = (spec.get("model") or {}).get("modelId")
    if model_id:
        args += ["--model-id", str(model_id)]
    engine = spec.get("engine") or {}
    for key, flag in ENGINE_FLAGS.items():
        if engine.get(key) is not None:
            args += [flag, str(engine[key])]
    spec_dec = engine.get("spec") or {}
    if spec_dec.get("mode", "off") == "mtp":
        args += ["--spec", "mtp"]
        if spec_dec.get("draftTokens") is not None:
            args += ["--draft-tokens", str(spec_dec["draftTokens"])]
    if engine.get("prefixReuse", True) is False:
        args.append("--no-prefix-reuse")
    if engine.get("vision"):
        args.append("--vision")
    # NOTE: the server re-checks the digest itself: hostPath/PVC contents can change after the Job ran.
    args += ["--expected-sha256", sha, "--request-log-jsonl", REQUEST_LOG]
    return args


# ----------------------------------------------------------------------------------------- placement


def labels(name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "ninfer",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/managed-by": "ninfer-operator",
        INSTANCE_LABEL: name,
    }


def selector(name: str) -> dict[str, str]:
    return {INSTANCE_LABEL: name, ROLE_LABEL: "server"}


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


# -------------------------------------------------------------------------------------- verification


def verify_job_name(name: str, sha: str, uri: str) -> str:
    """Deterministic per (digest, uri), so a retried handler finds its Job; <= 63 chars (pod label)."""
    uri_hash = hashlib.sha256(uri.encode()).hexdigest()[:5]
    return f"{name[:33].rstrip('-')}-verify-{sha[:12]}-{uri_hash}"


def render_verify_job(name: str, spec: Spec, default_image: str) -> Manifest:
    uri, sha = artifact_of(spec)
    mount = artifact_mount(uri)
    job_labels = {**labels(name), ROLE_LABEL: "verify"}
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
        **placement_fields(spec),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": verify_job_name(name, sha, uri),
            "labels": job_labels,
            "annotations": {SHA_ANNOTATION: sha, URI_ANNOTATION: uri},
        },
        "spec": {
            "backoffLimit": 0,  # a digest mismatch does not heal on retry
            "activeDeadlineSeconds": 7200,
            "template": {"metadata": {"labels": job_labels}, "spec": pod_spec},
        },
    }


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


def server_container(spec: Spec, default_image: str, mount: ArtifactMount) -> Manifest:
    gpus = str((spec.get("placement") or {}).get("gpuCount") or 1)
    memory = mib_quantity(memory_mib(spec))
    size = ((spec.get("model") or {}).get("artifact") or {}).get("sizeBytes")
    return {
        "name": "server",
        "image": image_of(spec, default_image),
        "command": server_args(spec, mount.path),
        "ports": [{"name": "http", "containerPort": SERVER_PORT, "protocol": "TCP"}],
        "resources": {
            "requests": {"cpu": "2", "memory": memory, GPU_RESOURCE: gpus},
            "limits": {"memory": memory, GPU_RESOURCE: gpus},
        },
        "startupProbe": _http_probe("/health", "http", STARTUP_PERIOD_S, startup_failure_threshold(size)),
        "readinessProbe": _http_probe("/health", "http", 5, 3),
        "livenessProbe": _http_probe("/health", "http", 20, 6),
        "volumeMounts": [
            mount.mount,
            {"name": "request-log", "mountPath": LOG_DIR},
            {"name": "model-config", "mountPath": CONFIG_DIR, "readOnly": True},
        ],
        "securityContext": container_security(),
    }


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
        "metadata": {"name": name, "labels": {**labels(name), ROLE_LABEL: "server"}},
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
                        {"name": "request-log", "emptyDir": {"sizeLimit": "2Gi"}},
                        {"name": "model-config", "configMap": {"name": config_map_name(name)}},
                    ],
                    "securityContext": pod_security(),
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 60,  # let streams in flight finish
                    **placement_fields(spec),
                },
            },
        },
    }


def render_service(name: str, spec: Spec) -> Manifest:
    ports = [{"name": "http", "port": SERVER_PORT, "targetPort": "http", "protocol": "TCP"}]
    if sidecar_enabled(spec):
        ports.append({"name": "monitor", "port": MONITOR_PORT, "targetPort": "monitor", "protocol": "TCP"})
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels(name)},
        "spec": {"type": "ClusterIP", "selector": selector(name), "ports": ports},
    }


def config_map_name(name: str) -> str:
    return f"{name}-model"


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


def session_hash_variable(header: str) -> str:
    """nginx variable for a request header: `X-Session-Id` -> `$http_x_session_id`."""
    return "$http_" + header.lower().replace("-", "_")


def render_ingress(name: str, spec: Spec) -> Manifest | None:
    """With routing.sessionHeader: an ingress-nginx Ingress that picks the replica by consistent
    hashing of that header (`upstream-hash-by`), so a returning session lands where its KV is parked."""
    routing = spec.get("routing") or {}
    header = routing.get("sessionHeader")
    if not header:
        return None
    rule: Manifest = {
        "http": {
            "paths": [
                {
                    "path": "/",
                    "pathType": "Prefix",
                    "backend": {"service": {"name": name, "port": {"name": "http"}}},
                }
            ]
        }
    }
    if routing.get("host"):
        rule["host"] = str(routing["host"])
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {
            "name": name,
            "labels": labels(name),
            "annotations": {
                "nginx.ingress.kubernetes.io/upstream-hash-by": session_hash_variable(str(header)),
                "nginx.ingress.kubernetes.io/proxy-buffering": "off",  # SSE streams
                "nginx.ingress.kubernetes.io/proxy-read-timeout": "3600",
            },
        },
        "spec": {"ingressClassName": str(routing.get("ingressClassName") or "nginx"), "rules": [rule]},
    }


def serving_sha(deployment: Mapping[str, Any] | None) -> str | None:
    """The digest the Deployment's pod template serves, or None without a Deployment."""
    if not deployment:
        return None
    meta = ((deployment.get("spec") or {}).get("template") or {}).get("metadata") or {}
    return (meta.get("annotations") or {}).get(SHA_ANNOTATION)
