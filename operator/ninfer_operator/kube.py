"""The operator's only API calls: children (read, create, replace-on-drift, patch, delete, list) and the
resource itself outside kopf's handlers (read, list, status patch).

Bodies are plain dicts (camelCase, as rendered by resources.py); reads come back as plain dicts too.
InferencePool and HTTPRoute are custom resources (Gateway API and its Inference Extension), reached
through the CustomObjectsApi.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

Manifest = dict[str, Any]

# kind -> (API class, method suffix)
_KINDS: dict[str, tuple[type, str]] = {
    "Deployment": (kubernetes.client.AppsV1Api, "namespaced_deployment"),
    "Service": (kubernetes.client.CoreV1Api, "namespaced_service"),
    "ConfigMap": (kubernetes.client.CoreV1Api, "namespaced_config_map"),
    "Job": (kubernetes.client.BatchV1Api, "namespaced_job"),
    "Ingress": (kubernetes.client.NetworkingV1Api, "namespaced_ingress"),
    "Pod": (kubernetes.client.CoreV1Api, "namespaced_pod"),
}
# kind -> (group, version, plural) for custom resources
CUSTOM: dict[str, tuple[str, str, str]] = {
    "InferencePool": ("inference.networking.k8s.io", "v1", "inferencepools"),
    "HTTPRoute": ("gateway.networking.k8s.io", "v1", "httproutes"),
}


def login() -> None:
    """In-cluster service account when running in a pod, else $KUBECONFIG / ~/.kube/config."""
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        # NOTE: read $KUBECONFIG now; the client's own default was fixed when it was imported.
        kubernetes.config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
    _api.cache_clear()


@functools.cache
def _api(cls: type) -> Any:
    return cls()


def _call(kind: str, verb: str) -> Any:
    if kind in CUSTOM:
        return _custom_call(kind, verb)
    cls, suffix = _KINDS[kind]
    return getattr(_api(cls), f"{verb}_{suffix}")


def _custom_call(kind: str, verb: str) -> Any:
    """The CustomObjectsApi call shaped like the typed ones: (name, namespace, ...) / (namespace, body)."""
    group, version, plural = CUSTOM[kind]
    api = _api(kubernetes.client.CustomObjectsApi)
    if verb == "create":
        return lambda ns, body: api.create_namespaced_custom_object(group, version, ns, plural, body)
    if verb == "list":
        return lambda ns, label_selector: _Items(
            api.list_namespaced_custom_object(group, version, ns, plural, label_selector=label_selector)
        )
    method = {"read": "get", "replace": "replace", "patch": "patch", "delete": "delete"}[verb]
    fn = getattr(api, f"{method}_namespaced_custom_object")
    return lambda name, ns, *rest, **kw: fn(group, version, ns, plural, name, *rest)


class _Items:
    def __init__(self, listing: Mapping[str, Any]) -> None:
        self.items = listing.get("items") or []


def _to_dict(obj: Any) -> Manifest:
    return kubernetes.client.ApiClient().sanitize_for_serialization(obj)


def read(kind: str, namespace: str, name: str) -> Manifest | None:
    try:
        return _to_dict(_call(kind, "read")(name, namespace))
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def create(kind: str, namespace: str, body: Manifest) -> Manifest:
    """Create; if a concurrent handler won the race (409), return what is there."""
    try:
        return _to_dict(_call(kind, "create")(namespace, body))
    except ApiException as e:
        if e.status != 409:
            raise
    existing = read(kind, namespace, body["metadata"]["name"])
    assert existing is not None, f"{kind} {body['metadata']['name']} conflicted on create but is gone"
    return existing


def is_subset(want: Any, have: Any) -> bool:
    """True when every field we render is present with the same value (server defaults may add more)."""
    if isinstance(want, Mapping):
        return isinstance(have, Mapping) and all(is_subset(v, have.get(k)) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(want) == len(have) and all(map(is_subset, want, have))
    return want == have or (have is not None and str(want) == str(have))


def ensure(kind: str, namespace: str, body: Manifest) -> tuple[Manifest, str]:
    """Make the live object match `body`: (object, 'created' | 'replaced' | 'unchanged'). A replace that
    lost a race with another writer (409) is retried on a fresh read."""
    for attempt in range(3):
        try:
            return _ensure_once(kind, namespace, body)
        except ApiException as e:
            if e.status != 409 or attempt == 2:
                raise
    raise AssertionError("unreachable")


def _ensure_once(kind: str, namespace: str, body: Manifest) -> tuple[Manifest, str]:
    name = body["metadata"]["name"]
    live = read(kind, namespace, name)
    if live is None:
        return create(kind, namespace, body), "created"
    if is_subset(body["metadata"].get("labels") or {}, live["metadata"].get("labels") or {}) and is_subset(
        {k: v for k, v in body.items() if k not in ("metadata", "apiVersion", "kind")}, live
    ):
        return live, "unchanged"
    new = {**body, "metadata": {**body["metadata"], "resourceVersion": live["metadata"]["resourceVersion"]}}
    if kind == "Service":  # the cluster IP is immutable; keep the allocated one
        new["spec"] = {**body["spec"], "clusterIP": live["spec"].get("clusterIP")}
    return _to_dict(_call(kind, "replace")(name, namespace, new)), "replaced"


def patch(kind: str, namespace: str, name: str, body: Manifest) -> Manifest:
    return _to_dict(_call(kind, "patch")(name, namespace, body))


def delete(kind: str, namespace: str, name: str) -> bool:
    try:
        _call(kind, "delete")(name, namespace, propagation_policy="Background")
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise


def list_names(kind: str, namespace: str, label_selector: str) -> list[Manifest]:
    items = _call(kind, "list")(namespace, label_selector=label_selector).items
    return [_to_dict(i) for i in items]


# -- the NInferDeployment itself, outside kopf's handlers (child events, the resync loop) -----------------


def _crs() -> Any:
    return _api(kubernetes.client.CustomObjectsApi)


def read_resource(group: str, version: str, plural: str, namespace: str, name: str) -> Manifest | None:
    try:
        return dict(_crs().get_namespaced_custom_object(group, version, namespace, plural, name))
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def list_resources(group: str, version: str, plural: str) -> list[Manifest]:
    return list(_crs().list_cluster_custom_object(group, version, plural).get("items") or [])


def patch_resource_status(
    group: str, version: str, plural: str, namespace: str, name: str, status: Manifest
) -> None:
    _crs().patch_namespaced_custom_object_status(group, version, namespace, plural, name, {"status": status})
