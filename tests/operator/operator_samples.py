"""Sample NInferDeployment specs shared by the operator tests (unique module name: no conftest clash)."""

from __future__ import annotations

from typing import Any

GOOD_SHA = "a" * 64
BAD_SHA = "b" * 64

SAMPLE: dict[str, Any] = {
    "model": {
        "modelId": "qwen3.6-27b",
        "weightsId": "qwen3.6-27b-nvfp4",
        "artifact": {
            "uri": "pvc://models/qwen3.6-27b.ninfer",
            "sha256": GOOD_SHA,
            "sizeBytes": 20_000_000_000,
        },
    },
    "engine": {
        "maxContext": 131072,
        "kvCapacity": "auto",
        "maxConcurrency": 4,
        "hostKvCacheMiB": 16384,
        "spec": {"mode": "off"},
        "prefixReuse": True,
        "kvDtype": "int8",
        "vision": False,
    },
    "placement": {"gpuProduct": ["NVIDIA-GeForce-RTX-5090"], "gpuCount": 1},
    "replicas": 2,
    "image": "registry.example/ninfer-server:1",
    "monitoring": {"sidecar": True},
    "routing": {"gateway": {"name": "inference-gateway", "sectionName": "http"}},
}
