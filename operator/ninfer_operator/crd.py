"""The `ninferdeployments.ninfer.io` CustomResourceDefinition, rendered from Python.

The chart ships the YAML `render_crd_yaml()` returns (regenerate with `scripts/k8s/gen-crd.sh`); a test
checks that the two agree. The schema targets Kubernetes >= 1.20: structural, with defaults, enums, patterns
and ranges, and no CEL rules (those need 1.25+). Cross-field rules live in `resources.validate_spec`
and are enforced by the operator with `kopf.PermanentError`.
"""

from __future__ import annotations

from typing import Any

import yaml

from . import GROUP, KIND, PLURAL, SHORT_NAME, VERSION
from .names import LABEL_MAX, NAME_PATTERN

SHA256_PATTERN = "^[0-9a-f]{64}$"
# pvc://<claim>/<path in the claim>  or  file:///<absolute path on every target node>
ARTIFACT_URI_PATTERN = r"^(pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?/[^/].*|file:///[^/].*)$"
DEFAULT_GPU_PRODUCTS = ["NVIDIA-GeForce-RTX-5090"]
DNS_1035 = "^[a-z]([-a-z0-9]*[a-z0-9])?$"

Schema = dict[str, Any]


def _str(**extra: Any) -> Schema:
    return {"type": "string", **extra}


def _int(minimum: int | None = None, maximum: int | None = None, **extra: Any) -> Schema:
    out: Schema = {"type": "integer", **extra}
    if minimum is not None:
        out["minimum"] = minimum
    if maximum is not None:
        out["maximum"] = maximum
    return out


def _obj(properties: dict[str, Schema], required: list[str] | None = None, **extra: Any) -> Schema:
    out: Schema = {"type": "object", "properties": properties, **extra}
    if required:
        out["required"] = required
    return out


def _toleration() -> Schema:
    return _obj(
        {
            "key": _str(),
            "operator": _str(enum=["Exists", "Equal"]),
            "value": _str(),
            "effect": _str(enum=["NoSchedule", "PreferNoSchedule", "NoExecute"]),
            "tolerationSeconds": _int(),
        }
    )


def spec_schema() -> Schema:
    artifact = _obj(
        {
            "uri": _str(pattern=ARTIFACT_URI_PATTERN, description="pvc://CLAIM/PATH or file:///PATH"),
            "sha256": _str(pattern=SHA256_PATTERN, description="SHA-256 of the whole .ninfer file"),
            "sizeBytes": _int(1),
        },
        required=["uri", "sha256"],
    )
    model = _obj(
        {
            "modelId": _str(pattern="^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$"),
            "weightsId": _str(maxLength=128),
            "artifact": artifact,
        },
        required=["artifact"],
    )
    kv_capacity: Schema = {
        "x-kubernetes-int-or-string": True,
        # NOTE: anyOf branches of an int-or-string may carry no constraints (structural schema); the
        # pattern applies to the string form, and validate_spec rejects integers < 1.
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": "^(auto|[1-9][0-9]*)$",
        "description": "--kv-capacity: auto or a token count >= maxContext",
    }
    engine = _obj(
        {
            "maxContext": _int(1, description="--max-context"),
            "kvCapacity": kv_capacity,
            "maxConcurrency": _int(1, 8, description="--max-concurrency"),
            "hostKvCacheMiB": _int(0, description="--host-kv-cache-mib; also adds to the memory request"),
            "spec": _obj(
                {
                    "mode": _str(enum=["off", "mtp", "dflash"], default="off", description="--spec"),
                    "draftTokens": _int(1, 15, description="--draft-tokens (mtp 1..5, dflash 1..15)"),
                }
            ),
            "prefixReuse": {"type": "boolean", "default": True, "description": "false -> --no-prefix-reuse"},
            "kvDtype": _str(enum=["bf16", "int8"], description="--kv-dtype"),
            "vision": {"type": "boolean", "default": False, "description": "--vision"},
            "extraArgs": {
                "type": "array",
                "items": _str(),
                "description": "more ninfer-serve flags, passed verbatim after the ones the spec sets",
            },
        }
    )
    placement = _obj(
        {
            "gpuProduct": {
                "type": "array",
                "minItems": 1,
                "items": _str(pattern="^[A-Za-z0-9][A-Za-z0-9._-]*$"),
                "default": list(DEFAULT_GPU_PRODUCTS),
                "description": "nvidia.com/gpu.product values (GPU Feature Discovery); -SHARED also matches",
            },
            "gpuCount": _int(1, 8, default=1),
            "tolerations": {"type": "array", "items": _toleration()},
            "nodeSelector": {"type": "object", "additionalProperties": _str()},
        }
    )
    monitoring = _obj(
        {
            "sidecar": {"type": "boolean", "default": True, "description": "run ninfer-monitor in the pod"},
            "image": _str(minLength=1),
        }
    )
    picker = _obj(
        {
            "service": _str(pattern=DNS_1035, description="the EPP Service (default <name>-epp)"),
            "port": _int(1, 65535, default=9002),
            "failureMode": _str(enum=["FailOpen", "FailClose"], default="FailClose"),
        }
    )
    gateway = _obj(
        {
            "name": _str(minLength=1, description="the Gateway the HTTPRoute attaches to"),
            "namespace": _str(),
            "sectionName": _str(description="the Gateway listener"),
            "hostnames": {"type": "array", "items": _str()},
            "requestTimeout": _str(pattern="^[0-9]+(ms|s|m|h)$", default="3600s"),
            "endpointPicker": {**picker, "default": {}},
        },
        required=["name"],
        description="Gateway API Inference Extension: an InferencePool + an HTTPRoute on this Gateway",
    )
    ingress = _obj(
        {
            "sessionHeader": _str(pattern="^[A-Za-z0-9][A-Za-z0-9-]*$"),
            "className": _str(default="nginx"),
            "host": _str(),
            "tlsSecret": _str(),
        },
        required=["sessionHeader"],
        description="LEGACY: ingress-nginx (retired March 2026) consistent hashing on a session header",
    )
    routing = _obj({"gateway": gateway, "ingress": ingress})
    resources = _obj(
        {
            "requests": {"type": "object", "additionalProperties": {"x-kubernetes-int-or-string": True}},
            "limits": {"type": "object", "additionalProperties": {"x-kubernetes-int-or-string": True}},
        },
        description="server container resources, merged over the defaults",
    )
    return _obj(
        {
            "model": model,
            "engine": {**engine, "default": {}},
            "placement": {**placement, "default": {}},
            "replicas": _int(0, default=1),
            "image": _str(minLength=1),
            "monitoring": {**monitoring, "default": {}},
            "routing": routing,
            "imagePullSecrets": {"type": "array", "items": _obj({"name": _str(minLength=1)}, ["name"])},
            "apiKeySecret": _obj(
                {"name": _str(minLength=1), "key": _str(default="api-key")},
                ["name"],
                description="Secret holding the key clients must send ($NINFER_API_KEY in the server)",
            ),
            "resources": resources,
            "drainSeconds": _int(
                1,
                86400,
                default=600,
                description="--shutdown-timeout-s: drain budget on stop; terminationGracePeriodSeconds adds 15",
            ),
        },
        required=["model"],
    )


def status_schema() -> Schema:
    condition = _obj(
        {
            "type": _str(),
            "status": _str(enum=["True", "False", "Unknown"]),
            "reason": _str(),
            "message": _str(),
            "lastTransitionTime": _str(format="date-time"),
            "observedGeneration": _int(),
        },
        required=["type", "status"],
    )
    return _obj(
        {
            "observedGeneration": _int(),
            "phase": _str(),
            "verifiedSha256": _str(),
            "verifiedUri": _str(),
            "digest": _str(description="first 12 hex digits of spec.model.artifact.sha256"),
            "servingSha256": _str(description="the digest in the Deployment's pod template"),
            "servingDigest": _str(description="first 12 hex digits of servingSha256"),
            "replicas": _int(),
            "readyReplicas": _int(),
            "updatedReplicas": _int(),
            "availableReplicas": _int(),
            "ready": _str(description="readyReplicas/replicas"),
            "selector": _str(),
            "verificationJob": _str(),
            "conditions": {"type": "array", "items": condition},
        }
    )


def _condition_column(name: str, condition: str) -> dict[str, Any]:
    return {
        "name": name,
        "type": "string",
        "jsonPath": f'.status.conditions[?(@.type=="{condition}")].status',
    }


def render_crd() -> dict[str, Any]:
    version = {
        "name": VERSION,
        "served": True,
        "storage": True,
        "schema": {
            "openAPIV3Schema": _obj(
                {
                    # a structural schema may constrain metadata.name (and nothing else in metadata)
                    "metadata": _obj({"name": _str(pattern=NAME_PATTERN, maxLength=LABEL_MAX)}),
                    "spec": spec_schema(),
                    "status": status_schema(),
                },
                ["spec"],
            )
        },
        "subresources": {
            "status": {},
            "scale": {
                "specReplicasPath": ".spec.replicas",
                "statusReplicasPath": ".status.replicas",
                "labelSelectorPath": ".status.selector",
            },
        },
        "additionalPrinterColumns": [
            {"name": "Model", "type": "string", "jsonPath": ".spec.model.modelId"},
            {"name": "Serving", "type": "string", "jsonPath": ".status.servingDigest"},
            {"name": "Wanted", "type": "string", "jsonPath": ".status.digest", "priority": 1},
            {"name": "Ready", "type": "string", "jsonPath": ".status.ready"},
            _condition_column("Verified", "ArtifactVerified"),
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "plural": PLURAL,
                "singular": KIND.lower(),
                "kind": KIND,
                "shortNames": [SHORT_NAME],
                "categories": ["ninfer"],
            },
            "versions": [version],
        },
    }


def render_crd_yaml() -> str:
    header = "# Generated by operator/ninfer_operator/crd.py; do not edit by hand (a test checks it).\n"
    return header + yaml.safe_dump(render_crd(), sort_keys=False, width=110)
