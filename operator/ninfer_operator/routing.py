"""How traffic reaches the replicas: pure renders of the Service, the Gateway API Inference Extension objects
and the legacy Ingress.

  Service       <base>   always: http 8080 (+ monitor 8090); the plain way in for clusters without a Gateway
  InferencePool <base>   with routing.gateway: the replicas (selector, target port 8080) and the endpoint
                         picker (EPP) that chooses one per request from their queue depth, KV-cache use and
                         prefix-cache affinity (inference.networking.k8s.io/v1)
  HTTPRoute     <base>   with routing.gateway: the named Gateway's listener -> the InferencePool
                         (gateway.networking.k8s.io/v1)
  Ingress       <base>   LEGACY, with routing.ingress: ingress-nginx consistent hashing on a session header.
                         The ingress-nginx controller was retired in March 2026; prefer routing.gateway.

A returning agent session lands where its KV is parked because the EPP's prefix-cache scorer remembers
which replica served each prompt prefix, and a later turn's prompt starts with the earlier one; the chart's
EPP configuration sizes that memory for device KV plus host parking (charts/ninfer-operator/values.yaml).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .flags import SERVER_PORT
from .names import child_name

Manifest = dict[str, Any]
Spec = Mapping[str, Any]

MONITOR_PORT = 8090
EPP_PORT = 9002  # the endpoint picker's ext-proc gRPC port
INFERENCE_GROUP = "inference.networking.k8s.io"
GATEWAY_GROUP = "gateway.networking.k8s.io"
DEFAULT_REQUEST_TIMEOUT = "3600s"  # a 200k-token prefill plus a long answer


def gateway_of(spec: Spec) -> Mapping[str, Any] | None:
    return ((spec.get("routing") or {}).get("gateway")) or None


def uses_inference_pool(spec: Spec) -> bool:
    return gateway_of(spec) is not None


def epp_service_name(name: str, spec: Spec) -> str:
    """The endpoint picker's Service: spec.routing.gateway.endpointPicker.service, else `<base>-epp` (what
    the chart's `endpointPicker.pools[].name` renders for a pool of that name)."""
    picker = (gateway_of(spec) or {}).get("endpointPicker") or {}
    return str(picker.get("service") or child_name(name, "epp"))


def render_service(name: str, spec: Spec, labels: Mapping[str, str], selector: Mapping[str, str]) -> Manifest:
    ports = [{"name": "http", "port": SERVER_PORT, "targetPort": "http", "protocol": "TCP"}]
    if bool((spec.get("monitoring") or {}).get("sidecar", True)):
        ports.append({"name": "monitor", "port": MONITOR_PORT, "targetPort": "monitor", "protocol": "TCP"})
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": child_name(name), "labels": dict(labels)},
        "spec": {"type": "ClusterIP", "selector": dict(selector), "ports": ports},
    }


def render_inference_pool(
    name: str, spec: Spec, labels: Mapping[str, str], selector: Mapping[str, str]
) -> Manifest | None:
    gateway = gateway_of(spec)
    if gateway is None:
        return None
    picker = gateway.get("endpointPicker") or {}
    return {
        "apiVersion": f"{INFERENCE_GROUP}/v1",
        "kind": "InferencePool",
        "metadata": {"name": child_name(name), "labels": dict(labels)},
        "spec": {
            "selector": {"matchLabels": dict(selector)},
            "targetPorts": [{"number": SERVER_PORT}],
            "endpointPickerRef": {
                "kind": "Service",
                "name": epp_service_name(name, spec),
                "port": {"number": int(picker.get("port") or EPP_PORT)},
                "failureMode": str(picker.get("failureMode") or "FailClose"),
            },
        },
    }


def render_http_route(name: str, spec: Spec, labels: Mapping[str, str]) -> Manifest | None:
    gateway = gateway_of(spec)
    if gateway is None:
        return None
    parent: Manifest = {"group": GATEWAY_GROUP, "kind": "Gateway", "name": str(gateway["name"])}
    for key in ("namespace", "sectionName"):
        if gateway.get(key):
            parent[key] = str(gateway[key])
    route_spec: Manifest = {
        "parentRefs": [parent],
        "rules": [
            {
                "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                "backendRefs": [
                    {"group": INFERENCE_GROUP, "kind": "InferencePool", "name": child_name(name)}
                ],
                "timeouts": {"request": str(gateway.get("requestTimeout") or DEFAULT_REQUEST_TIMEOUT)},
            }
        ],
    }
    if gateway.get("hostnames"):
        route_spec["hostnames"] = [str(h) for h in gateway["hostnames"]]
    return {
        "apiVersion": f"{GATEWAY_GROUP}/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": child_name(name), "labels": dict(labels)},
        "spec": route_spec,
    }


def session_hash_variable(header: str) -> str:
    """nginx variable for a request header: `X-Session-Id` -> `$http_x_session_id`."""
    return "$http_" + header.lower().replace("-", "_")


def render_ingress(name: str, spec: Spec, labels: Mapping[str, str]) -> Manifest | None:
    """LEGACY (ingress-nginx is retired): with routing.ingress, an Ingress that picks the replica by
    consistent hashing of the session header (`upstream-hash-by`)."""
    ingress = (spec.get("routing") or {}).get("ingress")
    if not ingress:
        return None
    backend = {"service": {"name": child_name(name), "port": {"name": "http"}}}
    rule: Manifest = {"http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": backend}]}}
    if ingress.get("host"):
        rule["host"] = str(ingress["host"])
    ingress_spec: Manifest = {"ingressClassName": str(ingress.get("className") or "nginx"), "rules": [rule]}
    if ingress.get("tlsSecret"):
        tls: Manifest = {"secretName": str(ingress["tlsSecret"])}
        if ingress.get("host"):
            tls["hosts"] = [str(ingress["host"])]
        ingress_spec["tls"] = [tls]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {
            "name": child_name(name),
            "labels": dict(labels),
            "annotations": {
                "nginx.ingress.kubernetes.io/upstream-hash-by": session_hash_variable(
                    str(ingress["sessionHeader"])
                ),
                "nginx.ingress.kubernetes.io/proxy-buffering": "off",  # SSE streams
                "nginx.ingress.kubernetes.io/proxy-read-timeout": "3600",
            },
        },
        "spec": ingress_spec,
    }


def routing_errors(spec: Spec) -> list[str]:
    routing = spec.get("routing") or {}
    if routing.get("gateway") and routing.get("ingress"):
        return ["routing.gateway and routing.ingress (legacy) are alternatives: set one"]
    return []
