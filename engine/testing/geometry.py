"""The synthetic geometries by name (`--synthetic GEOMETRY`), without torch: flag parsers import this.

synthetic.py builds the models; its `GEOMETRIES` holds the `ModelConfig` of each name in `REAL_GEOMETRIES`.
"""

from __future__ import annotations

REAL_GEOMETRIES: tuple[str, ...] = ("qwen3.6-27b", "qwen3.6-35b-a3b")  # real sizes: a GPU is needed
TINY_GEOMETRY = "tiny-dense"  # the `build-tiny` dense layout: small enough for the CPU
SYNTHETIC_NAMES: tuple[str, ...] = (*REAL_GEOMETRIES, TINY_GEOMETRY)
SYNTHETIC_SUFFIX = "-synthetic"
SYNTHETIC_WEIGHTS_ID = "random-synthetic"


def needs_cuda(name: str) -> bool:
    """Whether the geometry is too large to serve anywhere but on a GPU."""
    return name in REAL_GEOMETRIES


def synthetic_model_id(name: str) -> str:
    return name + SYNTHETIC_SUFFIX
