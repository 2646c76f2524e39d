"""One reconcile pass over one NInferDeployment: decisions here, renders in resources.py / routing.py, API
calls in kube.py. handlers.py runs it from every trigger; see its docstring for the steps.

The pass never raises for expected states: waiting for a Job, a failed verification, an invalid or
unsupported spec and a child the API server refuses all become conditions (and, when they change, an
Event). The status is written once at the end, and only when it changed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

from . import GROUP, PLURAL, VERSION, conditions, flags, kube, names, resources, routing
from .placement import placement_condition

log = logging.getLogger(__name__)
Manifest = dict[str, Any]


def owner_reference(body: Mapping[str, Any], controller: bool) -> Manifest:
    meta = body["metadata"]
    return {
        "apiVersion": body["apiVersion"],
        "kind": body["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def api_message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "").get("message") or e.reason)
    except (TypeError, ValueError):
        return str(e.reason or e)


def post_event(body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    """An Event on the resource (kopf's poster only works inside its handlers; this works anywhere)."""
    meta = body["metadata"]
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    event = {
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": body["apiVersion"],
            "kind": body["kind"],
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
        },
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": "ninfer-operator"},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        kubernetes.client.CoreV1Api().create_namespaced_event(meta["namespace"], event)  # type: ignore[arg-type]
    except ApiException as e:  # an Event is best effort
        log.warning("could not post Event %s on %s: %s", reason, meta["name"], api_message(e))


class Reconciler:
    def __init__(self, body: Mapping[str, Any], nodes: list[dict[str, Any]] | None, image: str) -> None:
        self.body, self.nodes, self.image = body, nodes, image
        self.name = body["metadata"]["name"]
        self.namespace = body["metadata"]["namespace"]
        self.generation = body["metadata"].get("generation")
        self.spec: Mapping[str, Any] = body.get("spec") or {}
        self.old_status: Mapping[str, Any] = body.get("status") or {}
        self.status: Manifest = {}
        self.conds: list[dict[str, Any]] = [dict(c) for c in self.old_status.get("conditions") or []]
        self.spec_problem = False

    def cond(self, type_: str, status: str, reason: str, message: str, event: str | None = None) -> None:
        """Set a condition; with `event` ("Warning"/"Normal"), post an Event when reason or message change."""
        old = conditions.get_condition(self.conds, type_) or {}
        if event and (old.get("reason") != reason or old.get("message") != message):
            post_event(self.body, event, reason, message)
        self.conds = conditions.set_condition(self.conds, type_, status, reason, message, self.generation)

    def run(self) -> None:
        deployment = kube.read("Deployment", self.namespace, names.child_name(self.name))
        try:
            if self.check_spec():
                if self.nodes is not None:
                    placement = self.spec.get("placement") or {}
                    self.cond("PlacementSatisfiable", *placement_condition(self.nodes, placement))
                deployment = self.sync_replicas(deployment)
                if self.verify():
                    deployment = self.roll_out() or deployment
        finally:
            self.write_status(deployment)

    # -- spec -----------------------------------------------------------------------------------
    def check_spec(self) -> bool:
        errors = resources.validate_spec(self.name, self.spec)
        if errors:
            self.cond("Ready", "False", "InvalidSpec", "; ".join(errors), event="Warning")
            self.spec_problem = True
            return False
        unsupported = flags.unsupported_reasons(self.spec)
        if unsupported:
            self.cond("Ready", "False", "Unsupported", "; ".join(unsupported), event="Warning")
            self.spec_problem = True
            return False
        return True

    def sync_replicas(self, deployment: Manifest | None) -> Manifest | None:
        """`kubectl scale` / an HPA reach the serving Deployment even while a new digest is verifying or
        blocked (only the replica count; the pod template waits for the gate)."""
        desired = int(self.spec.get("replicas", 1))
        if deployment is None or (deployment.get("spec") or {}).get("replicas") == desired:
            return deployment
        return kube.patch(
            "Deployment", self.namespace, names.child_name(self.name), {"spec": {"replicas": desired}}
        )

    # -- artifact gate --------------------------------------------------------------------------
    def verify(self) -> bool:
        uri, sha = resources.artifact_of(self.spec)
        if self.old_status.get("verifiedSha256") == sha and self.old_status.get("verifiedUri") == uri:
            self.status.update(verifiedSha256=sha, verifiedUri=uri)
            self.cond("ArtifactVerified", "True", "DigestMatch", f"sha256 {sha} verified")
            return True
        job_name = resources.verify_job_name(sha, uri)
        self.status["verificationJob"] = job_name
        job = self.adopt_job(job_name, sha)
        state = resources.job_state(job)
        if state == "succeeded":
            self.status.update(verifiedSha256=sha, verifiedUri=uri)
            self.cond("ArtifactVerified", "True", "DigestMatch", f"sha256 {sha} verified by Job {job_name}")
            return True
        if state == "failed":
            pods = kube.list_names("Pod", self.namespace, f"job-name={job_name}")
            reason, detail = resources.failure_reason(job, pods)
            serving = resources.serving_sha(
                kube.read("Deployment", self.namespace, names.child_name(self.name))
            )
            keep = f"; the Deployment keeps serving sha256 {serving[:12]}" if serving else ""
            message = f"Job {job_name} ({uri}, sha256 {sha[:12]}): {detail}{keep}"
            self.cond("ArtifactVerified", "False", reason, message, event="Warning")
            return False
        self.cond(
            "ArtifactVerified", "Unknown", "Verifying", f"Job {job_name} is verifying sha256 {sha[:12]}"
        )
        return False

    def adopt_job(self, job_name: str, sha: str) -> Manifest:
        """The namespace's Job for this (uri, sha256): created by the first resource that needs it, each
        later one adds itself as an owner (the garbage collector removes it with its last owner)."""
        ref = owner_reference(self.body, controller=False)
        job = kube.read("Job", self.namespace, job_name)
        if job is None:
            job = resources.render_verify_job(self.spec, self.image)
            job["metadata"]["ownerReferences"] = [ref]
            job = kube.create("Job", self.namespace, job)
            post_event(self.body, "Normal", "Verifying", f"Job {job_name} verifies sha256 {sha[:12]}")
        owners = job["metadata"].get("ownerReferences") or []
        if all(o.get("uid") != ref["uid"] for o in owners):
            job = kube.patch(
                "Job", self.namespace, job_name, {"metadata": {"ownerReferences": [*owners, ref]}}
            )
        return job

    def drop_stale_jobs(self) -> None:
        """Leave the Jobs of earlier digests: delete one when this resource was its last owner."""
        uri, sha = resources.artifact_of(self.spec)
        keep = resources.verify_job_name(sha, uri)
        uid = self.body["metadata"]["uid"]
        for job in kube.list_names("Job", self.namespace, f"{resources.ROLE_LABEL}=verify"):
            meta = job["metadata"]
            owners = meta.get("ownerReferences") or []
            if meta["name"] == keep or all(o.get("uid") != uid for o in owners):
                continue
            rest = [o for o in owners if o.get("uid") != uid]
            if rest:
                kube.patch("Job", self.namespace, meta["name"], {"metadata": {"ownerReferences": rest}})
            else:
                kube.delete("Job", self.namespace, meta["name"])

    # -- children -------------------------------------------------------------------------------
    def children(self) -> tuple[list[Manifest], list[str]]:
        """(children to ensure, kinds to remove because the spec no longer asks for them)."""
        labels, sel = resources.labels(self.name), resources.selector(self.name)
        out = [
            resources.render_config_map(self.name, self.spec),
            resources.render_deployment(self.name, self.spec, self.image),
            routing.render_service(self.name, self.spec, labels, sel),
        ]
        gone = []
        optional = {
            "InferencePool": routing.render_inference_pool(self.name, self.spec, labels, sel),
            "HTTPRoute": routing.render_http_route(self.name, self.spec, labels),
            "Ingress": routing.render_ingress(self.name, self.spec, labels),
        }
        for kind, child in optional.items():
            if child is None:
                gone.append(kind)
            else:
                out.append(child)
        return out, gone

    def roll_out(self) -> Manifest | None:
        """Ensure every child; returns the live Deployment when it was written."""
        want, gone = self.children()
        refused: list[str] = []
        deployment = None
        for child in want:
            child["metadata"]["ownerReferences"] = [owner_reference(self.body, controller=True)]
            try:
                live, action = kube.ensure(child["kind"], self.namespace, child)
            except ApiException as e:
                refused.append(f"{child['kind']} {child['metadata']['name']}: {api_message(e)}")
                continue
            if child["kind"] == "Deployment":
                deployment = live
            if action != "unchanged":
                log.info("%s %s/%s %s", child["kind"], self.namespace, child["metadata"]["name"], action)
        for kind in gone:
            try:
                if kube.read(kind, self.namespace, names.child_name(self.name)) is not None:
                    kube.delete(kind, self.namespace, names.child_name(self.name))
            except ApiException as e:
                if e.status != 404:  # 404: the kind's CRD is not installed, so there is nothing to remove
                    refused.append(f"removing {kind}: {api_message(e)}")
        if refused:
            self.cond("ChildrenReconciled", "False", "ChildRejected", "; ".join(refused), event="Warning")
        else:
            self.cond("ChildrenReconciled", "True", "AllCreated", f"{len(want)} children match the spec")
        self.drop_stale_jobs()
        return deployment

    # -- status ---------------------------------------------------------------------------------
    def write_status(self, deployment: Manifest | None) -> None:
        desired = int(self.spec.get("replicas", 1))
        counts = conditions.replica_counts(deployment, desired)
        for type_ in ("Progressing", "Available"):
            self.cond(type_, *conditions.deployment_condition(deployment, type_))
        if not self.spec_problem:  # an invalid or unsupported spec keeps the Ready set by check_spec
            current = deployment is not None and self._deployment_current(deployment)
            self.cond("Ready", *conditions.ready_condition(self.conds, counts, current))
        sha = str(((self.spec.get("model") or {}).get("artifact") or {}).get("sha256") or "")
        serving = resources.serving_sha(deployment)
        status = {
            **{k: v for k, v in self.old_status.items() if k in ("verifiedSha256", "verifiedUri")},
            **self.status,
            "observedGeneration": self.generation,
            "phase": conditions.phase(self.conds),
            "digest": sha[:12],
            "servingSha256": serving,
            "servingDigest": serving[:12] if serving else None,
            "replicas": counts["replicas"],
            "readyReplicas": counts["readyReplicas"],
            "updatedReplicas": counts["updatedReplicas"],
            "availableReplicas": counts["availableReplicas"],
            "ready": f"{counts['readyReplicas']}/{desired}",
            "selector": resources.selector_string(self.name),
            "conditions": self.conds,
        }
        if any(self.old_status.get(k) != v for k, v in status.items()):
            kube.patch_resource_status(GROUP, VERSION, PLURAL, self.namespace, self.name, status)

    def _deployment_current(self, deployment: Mapping[str, Any]) -> bool:
        """The live Deployment runs this generation's rendering, and its controller has seen it."""
        want = resources.render_deployment(self.name, self.spec, self.image)
        observed = (deployment.get("status") or {}).get("observedGeneration")
        return kube.is_subset(want["spec"], deployment.get("spec")) and observed == deployment[
            "metadata"
        ].get("generation")
