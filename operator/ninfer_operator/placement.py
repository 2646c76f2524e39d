"""GPU placement: the node-label terms every NInfer pod carries, and whether any node satisfies them.

Labels come from NVIDIA GPU Feature Discovery: `nvidia.com/gpu.product` is the sanitized NVML name
(`NVIDIA-GeForce-RTX-5090`), with `-SHARED` appended when time-slicing/MPS sharing is configured.
Pure functions; the operator feeds them from a kopf index over Nodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .crd import DEFAULT_GPU_PRODUCTS

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"
SHARED_SUFFIX = "-SHARED"


def gpu_products(placement: Mapping[str, Any]) -> list[str]:
    """The accepted `nvidia.com/gpu.product` values: each configured product and its -SHARED form."""
    out: list[str] = []
    for product in placement.get("gpuProduct") or DEFAULT_GPU_PRODUCTS:
        for value in (product, product + SHARED_SUFFIX):
            if value not in out:
                out.append(value)
    return out


def node_matches(labels: Mapping[str, str], placement: Mapping[str, Any]) -> bool:
    if labels.get(GPU_PRODUCT_LABEL) not in gpu_products(placement):
        return False
    return all(labels.get(k) == v for k, v in (placement.get("nodeSelector") or {}).items())


def placement_condition(
    nodes: Iterable[Mapping[str, Any]], placement: Mapping[str, Any]
) -> tuple[str, str, str]:
    """(status, reason, message) for the PlacementSatisfiable condition.

    `nodes` are index entries `{"name": ..., "labels": {...}}`. Taints are not checked: the pod
    tolerates the GPU taint and whatever `placement.tolerations` lists.
    """
    matching = sorted(n["name"] for n in nodes if node_matches(n.get("labels") or {}, placement))
    products = ", ".join(gpu_products(placement))
    if matching:
        shown = ", ".join(matching[:5]) + (" ..." if len(matching) > 5 else "")
        return (
            "True",
            "NodesFound",
            f"{len(matching)} node(s) match {GPU_PRODUCT_LABEL} in [{products}]: {shown}",
        )
    return (
        "False",
        "NoMatchingNodes",
        f"no node has {GPU_PRODUCT_LABEL} in [{products}] and the nodeSelector; pods will stay Pending",
    )
