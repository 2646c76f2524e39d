"""kopf handlers for NInferDeployment: thin entry points into one level-based reconcile.

Every trigger runs the same `reconcile(namespace, name)`: kopf's create / spec-update / resume handlers, the
watch on the children (Deployments, Services, ConfigMaps, verification Jobs: a child's change or deletion
re-reconciles its owners at once, so status counts are fresh and drift is repaired), Node changes (the
placement index), and a resync loop every NINFER_OPERATOR_RESYNC_INTERVAL seconds for the children that are
not watched (InferencePool, HTTPRoute, Ingress). No handler raises to make kopf retry: waiting is a
condition, and the Job watch moves things on, so the operator log holds no ERROR line for normal progress.

No handler needs a finalizer (no delete handler, no kopf timer): children carry owner references and the
garbage collector removes them, so `helm uninstall` before deleting the resources leaves nothing stuck.
kopf drops the finalizer that earlier versions added.

One pass (reconcile.Reconciler is the logic; this module only wires the triggers):
  1. name and cross-field validation -> Ready=False/InvalidSpec, phase Invalid, a Warning Event
  2. modes the server cannot run yet (flags.FLAG_TABLE) -> Ready=False/Unsupported, phase Unsupported
  3. scale: a changed spec.replicas reaches the live Deployment even while verification blocks a rollout
  4. artifact gate: the shared verification Job for (uri, sha256); a failed Job names its reason
  5. children (ConfigMap, Deployment, Service, InferencePool + HTTPRoute or the legacy Ingress); a child
     the API server refuses -> ChildrenReconciled=False with its message, phase Failed, a Warning Event
  6. status from the Deployment
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from . import GROUP, KIND, PLURAL, VERSION, kube
from .config import OperatorConfig
from .placement import GPU_PRODUCT_LABEL
from .reconcile import Reconciler
from .resources import MANAGED_BY

CONFIG = OperatorConfig.from_env()
log = logging.getLogger(__name__)
_locks: dict[tuple[str, str], threading.Lock] = {}
_locks_guard = threading.Lock()
_nodes_index: list[Any] = []  # the live kopf index, stashed by the first handler that receives it
_stop = threading.Event()
_resync: list[threading.Thread] = []  # the running resync loop, joined at cleanup
RESYNC_JOIN_S = 30.0  # how long cleanup waits for a resync pass in flight
CHILD_LABELS = {"app.kubernetes.io/managed-by": MANAGED_BY}
CHILD_SELECTOR = f"app.kubernetes.io/managed-by={MANAGED_BY}"


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="ninfer.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="ninfer.io", key="last-handled-configuration"
    )
    # NOTE: nothing requires a finalizer any more; naming the old one lets kopf remove it from resources
    settings.persistence.finalizer = "ninfer.io/finalizer"
    settings.posting.level = logging.INFO
    watch_selectors(settings)
    kube.login()
    _stop.clear()
    thread = threading.Thread(target=_resync_loop, name="ninfer-resync", daemon=True)
    thread.start()
    _resync.append(thread)


def watch_selectors(settings: kopf.OperatorSettings) -> None:
    """The child and node filters go to the API server as label selectors (kopf >= 1.45), so the operator
    does not stream every Deployment, Service and ConfigMap of the cluster to filter them itself."""
    selectors = getattr(settings.watching, "label_selectors", None)
    if selectors is None:  # older kopf: the handlers' own label filters still apply, client-side
        return
    for plural in ("deployments", "jobs", "services", "configmaps"):
        selectors[plural] = CHILD_SELECTOR
    selectors["nodes"] = GPU_PRODUCT_LABEL


@kopf.on.cleanup()
def stop(**_: Any) -> None:
    """Stop the resync loop and wait for a pass in flight: a daemon thread still inside an HTTPS request when the
    interpreter exits aborts the process (exit status -6 after a clean kopf shutdown, seen in the test suite)."""
    _stop.set()
    while _resync:
        _resync.pop().join(RESYNC_JOIN_S)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's own connection: the pod's service account, else $KUBECONFIG as it is at startup."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.index("nodes", labels={GPU_PRODUCT_LABEL: kopf.PRESENT})
def gpu_nodes(name: str, labels: Mapping[str, str], **_: Any) -> dict[str, dict[str, Any]]:
    return {"gpu": {"name": name, "labels": dict(labels)}}


def _nodes() -> list[dict[str, Any]] | None:
    """The GPU nodes from the index, or None before any handler has seen it (placement then unchanged)."""
    if not _nodes_index:
        return None
    index = _nodes_index[0]
    return [node for key in index for node in index[key]]


def _remember(index: Any) -> None:
    if index is not None and not _nodes_index:
        _nodes_index.append(index)


def _lock(namespace: str, name: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault((namespace, name), threading.Lock())


def reconcile(namespace: str, name: str) -> None:
    """One pass over one resource, serialized per resource (handlers, child events and the loop race)."""
    with _lock(namespace, name):
        body = kube.read_resource(GROUP, VERSION, PLURAL, namespace, name)
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            return
        try:
            Reconciler(body, _nodes(), CONFIG.server_image).run()
        except ApiException as e:
            if e.status != 404:
                raise
            # deleted while the pass ran (no finalizer holds it): its children go with it
            log.info("%s/%s went away during reconcile", namespace, name)


# NOTE: kopf's handler protocols do not list index kwargs such as `gpu_nodes`, which kopf passes by name.
@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")  # type: ignore[arg-type]
def on_spec(name: str, namespace: str, gpu_nodes: kopf.Index[str, dict[str, Any]], **_: Any) -> None:
    _remember(gpu_nodes)
    reconcile(namespace, name)


def _owners(body: Mapping[str, Any]) -> list[str]:
    refs = (body.get("metadata") or {}).get("ownerReferences") or []
    return [
        r["name"] for r in refs if r.get("kind") == KIND and str(r.get("apiVersion", "")).startswith(GROUP)
    ]


@kopf.on.event("apps", "v1", "deployments", labels=CHILD_LABELS)
@kopf.on.event("batch", "v1", "jobs", labels=CHILD_LABELS)
@kopf.on.event("", "v1", "services", labels=CHILD_LABELS)
@kopf.on.event("", "v1", "configmaps", labels=CHILD_LABELS)  # type: ignore[arg-type]
def child_changed(
    body: kopf.Body, namespace: str, gpu_nodes: kopf.Index[str, dict[str, Any]], **_: Any
) -> None:
    """A child changed or went away: its owners re-reconcile now (fresh counts, drift undone)."""
    _remember(gpu_nodes)
    for owner in _owners(body):
        reconcile(namespace, owner)


@kopf.on.event("", "v1", "nodes", labels={GPU_PRODUCT_LABEL: kopf.PRESENT})  # type: ignore[arg-type]
def node_changed(gpu_nodes: kopf.Index[str, dict[str, Any]], **_: Any) -> None:
    _remember(gpu_nodes)
    _reconcile_all()


def _reconcile_all() -> None:
    for item in kube.list_resources(GROUP, VERSION, PLURAL):
        meta = item.get("metadata") or {}
        try:
            reconcile(meta["namespace"], meta["name"])
        except Exception:  # one broken resource must not stop the others
            log.exception("reconcile of %s/%s failed", meta.get("namespace"), meta.get("name"))


def _resync_loop() -> None:
    """Level-based repair of what no watch covers (routing objects) and a status refresh."""
    while not _stop.wait(CONFIG.resync_interval_s):
        try:
            _reconcile_all()
        except Exception:
            log.exception("resync pass failed")
