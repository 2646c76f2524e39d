"""Status conditions and the phase roll-up (pure).

Condition types: ArtifactVerified, PlacementSatisfiable, ChildrenReconciled (False when the API server refuses
a child: the reason and its message say which and why), Progressing, Available, Ready.
`lastTransitionTime` changes only when a condition's status flips (Kubernetes convention).
Ready=False reasons the operator sets before any rollout: InvalidSpec (a rule the schema cannot state) and
Unsupported (a mode ninfer-serve cannot run yet, flags.FLAG_TABLE); each gets its own phase.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

Condition = dict[str, Any]
CONDITION_TYPES = (
    "ArtifactVerified",
    "PlacementSatisfiable",
    "ChildrenReconciled",
    "Progressing",
    "Available",
    "Ready",
)
SPEC_REASONS = {"InvalidSpec": "Invalid", "Unsupported": "Unsupported"}  # Ready reason -> phase


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def get_condition(conditions: Iterable[Mapping[str, Any]], type_: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def set_condition(
    conditions: Iterable[Mapping[str, Any]],
    type_: str,
    status: str,
    reason: str,
    message: str,
    generation: int | None,
    now: str | None = None,
) -> list[Condition]:
    """Return a new list with `type_` set; other conditions are kept, in CONDITION_TYPES order."""
    assert status in ("True", "False", "Unknown"), f"bad condition status {status!r}"
    old = get_condition(conditions, type_)
    since: str | None
    if old is None or old.get("status") != status:
        since = now or now_rfc3339()
    else:
        since = old.get("lastTransitionTime")
    new: Condition = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
    }
    if generation is not None:
        new["observedGeneration"] = generation
    rest = [dict(c) for c in conditions if c.get("type") != type_]
    order = {t: i for i, t in enumerate(CONDITION_TYPES)}
    return sorted([*rest, new], key=lambda c: order.get(str(c.get("type")), len(order)))


def is_true(conditions: Iterable[Mapping[str, Any]], type_: str) -> bool:
    cond = get_condition(conditions, type_)
    return cond is not None and cond.get("status") == "True"


def deployment_condition(deployment: Mapping[str, Any] | None, type_: str) -> tuple[str, str, str]:
    """Copy the Deployment controller's own Progressing/Available condition (status, reason, message)."""
    if deployment is None:
        return "Unknown", "NoDeployment", "the Deployment is created once the artifact is verified"
    for cond in (deployment.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return str(cond.get("status")), str(cond.get("reason") or ""), str(cond.get("message") or "")
    return "Unknown", "Pending", "the Deployment controller has not reported yet"


def replica_counts(deployment: Mapping[str, Any] | None, desired: int) -> dict[str, int]:
    status = (deployment or {}).get("status") or {}
    return {
        "replicas": int(status.get("replicas") or 0) if deployment else 0,
        "readyReplicas": int(status.get("readyReplicas") or 0),
        "updatedReplicas": int(status.get("updatedReplicas") or 0),
        "availableReplicas": int(status.get("availableReplicas") or 0),
        "desired": desired,
    }


def ready_condition(
    conditions: Iterable[Mapping[str, Any]],
    counts: Mapping[str, int],
    deployment_current: bool,
) -> tuple[str, str, str]:
    """Ready = verified artifact, rollout of the current template finished, all replicas ready."""
    conds = list(conditions)
    desired = counts["desired"]
    if not is_true(conds, "ArtifactVerified"):
        return "False", "ArtifactNotVerified", "the artifact in the spec is not verified"
    child = get_condition(conds, "ChildrenReconciled")
    if child is not None and child.get("status") == "False":
        return "False", str(child.get("reason") or "ChildRejected"), str(child.get("message") or "")
    if not deployment_current:
        return "False", "RolloutPending", "the Deployment does not yet run the current spec"
    if desired == 0:
        return "False", "ScaledToZero", "replicas is 0: nothing serves"
    if counts["updatedReplicas"] < desired or counts["readyReplicas"] < desired:
        return "False", "ReplicasNotReady", f"{counts['readyReplicas']}/{desired} replicas ready"
    if not is_true(conds, "Available"):
        return "False", "Unavailable", "the Deployment is not Available"
    return "True", "AllReplicasReady", f"{counts['readyReplicas']}/{desired} replicas ready"


def phase(conditions: Iterable[Mapping[str, Any]]) -> str:
    """One word for `kubectl get`: Invalid, Unsupported, Verifying, Blocked, Failed, Ready, ScaledToZero,
    Unschedulable, Degraded or Progressing."""
    conds = list(conditions)
    ready = get_condition(conds, "Ready") or {}
    if ready.get("reason") in SPEC_REASONS:
        return SPEC_REASONS[str(ready["reason"])]
    verified = get_condition(conds, "ArtifactVerified")
    if verified is None or verified.get("status") == "Unknown":
        return "Verifying"
    if verified.get("status") == "False":
        return "Blocked"
    child = get_condition(conds, "ChildrenReconciled")
    if child is not None and child.get("status") == "False":
        return "Failed"
    if is_true(conds, "Ready"):
        return "Ready"
    if ready.get("reason") == "ScaledToZero":
        return "ScaledToZero"
    placement = get_condition(conds, "PlacementSatisfiable")
    if placement is not None and placement.get("status") == "False":
        return "Unschedulable"
    progressing = get_condition(conds, "Progressing")
    if progressing is not None and progressing.get("status") == "False":
        return "Degraded"
    return "Progressing"
