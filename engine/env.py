"""Every environment variable NInfer reads: one prefix (`NINFER_`), typed, parsed in one place."""

from __future__ import annotations

import os
from pathlib import Path

from platformdirs import user_cache_dir


def cache_dir() -> Path:
    """`NINFER_CACHE_DIR`: where built files (demo model, converted tokenizer) are cached."""
    return Path(os.environ.get("NINFER_CACHE_DIR") or user_cache_dir("ninfer"))


def kernels_mode() -> str:
    """`NINFER_KERNELS`: `auto` (Triton on CUDA, torch references elsewhere) or `ref` (references always)."""
    value = os.environ.get("NINFER_KERNELS", "auto")
    if value not in ("auto", "ref"):
        raise ValueError(f"NINFER_KERNELS={value!r}: expected 'auto' or 'ref'")
    return value


def gemv_mode() -> str:
    """`NINFER_GEMV`: `off` (the default: `F.linear`, cuBLAS, always), `auto` (decode-sized linear layers, at
    most 8 rows, run the Triton GEMV on CUDA where it was measured faster than cuBLAS alone) or `on` (the GEMV
    for every such layer). Parsed by `kernels._dispatch` at import (kernels may not import engine)."""
    from kernels._dispatch import parse_gemv_mode

    return parse_gemv_mode(os.environ.get("NINFER_GEMV", "off"))
