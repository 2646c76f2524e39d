"""Progress bars for long work (loading, hashing, converting): shown on a terminal, silent otherwise."""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm


def progress(total: int | None, desc: str, *, unit: str = "B", force: bool | None = None) -> tqdm[Any]:
    """A tqdm bar on stderr; hidden unless stderr is a terminal (or `force` says otherwise)."""
    show = sys.stderr.isatty() if force is None else force
    scale = unit == "B"
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        unit_scale=scale,
        unit_divisor=1024 if scale else 1000,
        disable=not show,
        file=sys.stderr,
        leave=False,
    )
