"""The embedded demo model: the tiny dense model, built once and cached under the user's cache directory.

`ninfer-serve` with no artifact serves it, so the README's first command works with no download. The file is
keyed by the tiny-model builder's inputs (arch, seed, builder version), rebuilt if missing or unreadable.
"""

from __future__ import annotations

import sys
from pathlib import Path

from engine.artifact.container import ArtifactError, read_directory
from engine.env import cache_dir

DEMO_ARCH = "dense"
DEMO_SEED = 0
BUILDER_VERSION = 1


def demo_cache_dir() -> Path:
    return cache_dir() / "demo"


def demo_artifact_path() -> Path:
    """Path of the demo artifact, building it on first use (a few seconds)."""
    path = demo_cache_dir() / f"tiny-{DEMO_ARCH}-seed{DEMO_SEED}-v{BUILDER_VERSION}.ninfer"
    if path.is_file():
        try:
            read_directory(path)
            return path
        except ArtifactError as exc:
            print(f"demo model at {path} is unreadable ({exc}); rebuilding", file=sys.stderr)
    from engine.testing.tiny import build_tiny

    path.parent.mkdir(parents=True, exist_ok=True)
    print(f"building the embedded demo model (tiny {DEMO_ARCH}, seed {DEMO_SEED}) at {path}", file=sys.stderr)
    return build_tiny(path, arch=DEMO_ARCH, seed=DEMO_SEED)
