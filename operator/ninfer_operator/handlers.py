"""kopf handlers for NInferDeployment: thin and idempotent; rendering and decisions live elsewhere.

Flow of one reconcile (create / spec update / resume / the drift timer all run the same steps):
  1. cross-field validation -> PermanentError (status phase Invalid)
  2. PlacementSatisfiable from the node index
  3. artifact gate: if spec's (uri, sha256) is not the verified one, create/read the verification Job;
     running -> TemporaryError; failed -> ArtifactVerified=False/DigestMismatch, Event, PermanentError
     (the Deployment is not touched, so the previous ReplicaSet keeps serving)
  4. verified -> ensure ConfigMap, Deployment, Service, Ingress (replace on drift), drop stale Jobs
  5. status from the Deployment: replica counts, Progressing/Available/Ready, phase
Children carry owner references (kopf.adopt): deleting the resource garbage-collects them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf

from . import GROUP, PLURAL, VERSION, conditions, kube, resources
from .config import OperatorConfig
from .placement import GPU_PRODUCT_LABEL, placement_condition

CONFIG = OperatorConfig.from_env()


class Waiting(Exception):
    """The verification Job is still running."""


class Blocked(Exception):
    """The spec cannot roll out (invalid, or the artifact failed verification)."""


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="ninfer.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="ninfer.io", key="last-handled-configuration"
    )
    # kopf keeps a finalizer while timers run on an object, so they stop before it goes away
    settings.persistence.finalizer = "ninfer.io/finalizer"
    settings.posting.level = logging.INFO
    kube.login()


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's own connection: the pod's service account, else $KUBECONFIG as it is at startup."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.index("nodes", labels={GPU_PRODUCT_LABEL: kopf.PRESENT})
def gpu_nodes(name: str, labels: Mapping[str, str], **_: Any) -> dict[str, dict[str, Any]]:
    return {"gpu": {"name": name, "labels": dict(labels)}}


def _nodes(index: kopf.Index[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [node for key in index for node in index[key]]


class Reconciler:
    """One pass over one NInferDeployment; collects the status it writes into `patch.status`."""

    def __init__(self, body: kopf.Body, patch: kopf.Patch, nodes: list[dict[str, Any]]) -> None:
        self.body, self.patch, self.nodes = body, patch, nodes
        self.name = body.metadata.name or ""
        self.namespace = body.metadata.namespace or "default"
        self.generation = body.metadata.get("generation")
        self.spec: Mapping[str, Any] = body.spec
        self.status: Mapping[str, Any] = body.status
        self.conds: list[dict[str, Any]] = [dict(c) for c in self.status.get("conditions") or []]

    def cond(self, type_: str, status: str, reason: str, message: str) -> None:
        self.conds = conditions.set_condition(self.conds, type_, status, reason, message, self.generation)

    def run(self) -> None:
        try:
            errors = resources.validate_spec(self.spec)
            if errors:
                self.cond("Ready", "False", "InvalidSpec", "; ".join(errors))
                raise Blocked("invalid spec: " + "; ".join(errors))
            self.cond(
                "PlacementSatisfiable", *placement_condition(self.nodes, self.spec.get("placement") or {})
            )
            if self.verify():
                self.roll_out()
        finally:
            self.write_status()

    # -- artifact gate --------------------------------------------------------------------------
    def verify(self) -> bool:
        uri, sha = resources.artifact_of(self.spec)
        if self.status.get("verifiedSha256") == sha and self.status.get("verifiedUri") == uri:
            self.cond("ArtifactVerified", "True", "DigestMatch", f"sha256 {sha} verified")
            return True
        job_name = resources.verify_job_name(self.name, sha, uri)
        self.patch.status["verificationJob"] = job_name
        job = kube.read("Job", self.namespace, job_name)
        if job is None:
            job = resources.render_verify_job(self.name, self.spec, CONFIG.server_image)
            kopf.adopt(job, owner=self.body)
            job = kube.create("Job", self.namespace, job)
            kopf.info(self.body, reason="Verifying", message=f"Job {job_name} verifies sha256 {sha[:12]}")
        state = resources.job_state(job)
        if state == "succeeded":
            self.patch.status["verifiedSha256"] = sha
            self.patch.status["verifiedUri"] = uri
            self.cond("ArtifactVerified", "True", "DigestMatch", f"sha256 {sha} verified by Job {job_name}")
            kopf.info(self.body, reason="ArtifactVerified", message=f"sha256 {sha[:12]} verified")
            return True
        if state == "failed":
            old = conditions.get_condition(self.conds, "ArtifactVerified") or {}
            serving = resources.serving_sha(kube.read("Deployment", self.namespace, self.name))
            keep = f"; the Deployment keeps serving sha256 {serving[:12]}" if serving else ""
            message = f"Job {job_name}: the artifact at {uri} does not have sha256 {sha}{keep}"
            if old.get("reason") != "DigestMismatch" or old.get("message") != message:
                kopf.warn(self.body, reason="DigestMismatch", message=message)
            self.cond("ArtifactVerified", "False", "DigestMismatch", message)
            raise Blocked(message)
        self.cond(
            "ArtifactVerified", "Unknown", "Verifying", f"Job {job_name} is verifying sha256 {sha[:12]}"
        )
        raise Waiting(f"verification Job {job_name} is running")

    # -- children -------------------------------------------------------------------------------
    def roll_out(self) -> None:
        children = [
            resources.render_config_map(self.name, self.spec),
            resources.render_deployment(self.name, self.spec, CONFIG.server_image),
            resources.render_service(self.name, self.spec),
        ]
        ingress = resources.render_ingress(self.name, self.spec)
        if ingress is not None:
            children.append(ingress)
        elif kube.read("Ingress", self.namespace, self.name) is not None:
            kube.delete("Ingress", self.namespace, self.name)
        for child in children:
            kopf.adopt(child, owner=self.body)
            _, action = kube.ensure(child["kind"], self.namespace, child)
            if action != "unchanged":
                logging.getLogger(__name__).info(
                    "%s %s/%s %s", child["kind"], self.namespace, self.name, action
                )
        self.drop_stale_jobs()

    def drop_stale_jobs(self) -> None:
        uri, sha = resources.artifact_of(self.spec)
        keep = resources.verify_job_name(self.name, sha, uri)
        selector = f"{resources.INSTANCE_LABEL}={self.name},{resources.ROLE_LABEL}=verify"
        for job in kube.list_names("Job", self.namespace, selector):
            if job["metadata"]["name"] != keep:
                kube.delete("Job", self.namespace, job["metadata"]["name"])

    # -- status ---------------------------------------------------------------------------------
    def write_status(self) -> None:
        deployment = kube.read("Deployment", self.namespace, self.name)
        desired = int(self.spec.get("replicas", 1))
        counts = conditions.replica_counts(deployment, desired)
        for type_ in ("Progressing", "Available"):
            self.cond(type_, *conditions.deployment_condition(deployment, type_))
        if not self._invalid():  # an invalid spec keeps the Ready=False/InvalidSpec set by run()
            current = deployment is not None and self._deployment_current(deployment)
            self.cond("Ready", *conditions.ready_condition(self.conds, counts, current))
        sha = str(((self.spec.get("model") or {}).get("artifact") or {}).get("sha256") or "")
        self.patch.status.update(
            {
                "observedGeneration": self.generation,
                "phase": conditions.phase(self.conds),
                "digest": sha[:12],
                "servingSha256": resources.serving_sha(deployment),
                "replicas": counts["replicas"],
                "readyReplicas": counts["readyReplicas"],
                "updatedReplicas": counts["updatedReplicas"],
                "availableReplicas": counts["availableReplicas"],
                "ready": f"{counts['readyReplicas']}/{desired}",
                "selector": resources.selector_string(self.name),
                "conditions": self.conds,
            }
        )

    def _invalid(self) -> bool:
        return bool(resources.validate_spec(self.spec))

    def _deployment_current(self, deployment: Mapping[str, Any]) -> bool:
        """The live Deployment runs this generation's rendering, and its controller has seen it."""
        want = resources.render_deployment(self.name, self.spec, CONFIG.server_image)
        observed = (deployment.get("status") or {}).get("observedGeneration")
        return kube.is_subset(want["spec"], deployment.get("spec")) and observed == deployment[
            "metadata"
        ].get("generation")


def _reconcile(
    body: kopf.Body, patch: kopf.Patch, index: kopf.Index[str, dict[str, Any]], timer: bool
) -> None:
    try:
        Reconciler(body, patch, _nodes(index)).run()
    except Waiting as e:
        raise kopf.TemporaryError(str(e), delay=CONFIG.retry_delay_s) from None
    except Blocked as e:
        if not timer:  # the timer just keeps the status fresh; a new spec generation retries
            raise kopf.PermanentError(str(e)) from None


# NOTE: kopf's handler protocols (ChangingFn, TimerFn) do not list index kwargs such as `gpu_nodes`,
# which kopf passes by name: hence the two arg-type ignores.
@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")  # type: ignore[arg-type]
def reconcile(
    body: kopf.Body, patch: kopf.Patch, gpu_nodes: kopf.Index[str, dict[str, Any]], **_: Any
) -> None:
    _reconcile(body, patch, gpu_nodes, timer=False)


@kopf.timer(GROUP, VERSION, PLURAL, interval=CONFIG.resync_interval_s, initial_delay=CONFIG.resync_interval_s)  # type: ignore[arg-type]
def resync(body: kopf.Body, patch: kopf.Patch, gpu_nodes: kopf.Index[str, dict[str, Any]], **_: Any) -> None:
    """Level-based repair: re-renders children (undoing drift) and refreshes status from the Deployment."""
    _reconcile(body, patch, gpu_nodes, timer=True)
