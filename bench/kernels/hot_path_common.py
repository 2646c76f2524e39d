"""What every bench/kernels/hot_path_*.py module shares: the Qwen3.6-27B geometry, the timing helpers and
``ROWS``, the rows bench/kernels/hot_path.py writes to its JSON. Importing it puts the repository on sys.path.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

DEV = "cuda"
BF16 = torch.bfloat16
HIDDEN, HK, HV, DK, DV, CONV_K = 5120, 16, 48, 128, 128, 4  # Qwen3.6-27B
HQ, HKV, HEAD_DIM, PAGE = 24, 4, 256, 64
ROWS: list[dict] = []


def _us(fn: Callable[[], object], graph: bool) -> float:
    if graph:
        try:
            return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3
        except Exception as exc:  # noqa: BLE001 - a reference that syncs cannot be captured: time it eagerly
            print(f"  (graph capture failed: {type(exc).__name__}; timing eagerly)")
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def _row(op: str, shape: str, nbytes: float, kernel: Callable[[], object], ref: Callable[[], object] | None,
         extra: dict | None = None) -> None:  # fmt: skip
    t_k = _us(kernel, graph=True)
    t_r = _us(ref, graph=False) if ref is not None else None
    row = {"op": op, "shape": shape, "kernel_us": round(t_k, 2), "ref_us": round(t_r, 2) if t_r else None,
           "bytes": int(nbytes), "kernel_GBps": round(nbytes / t_k / 1e3, 1), **(extra or {})}  # fmt: skip
    ROWS.append(row)
    print(json.dumps(row), flush=True)


def _err(actual: torch.Tensor, expected: torch.Tensor) -> dict:
    a, b = actual.double(), expected.double()
    rel = ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()).item()
    return {"max_abs_err": float(f"{(a - b).abs().max().item():.3e}"), "rel_rms_err": float(f"{rel:.3e}")}


def _read_us() -> float:
    """Microseconds to read 2 GiB (an fp32 sum, the best of the runs, as ninfer-bench measures bandwidth)."""
    x = torch.empty(1 << 29, device=DEV).uniform_()
    return triton.testing.do_bench(x.sum, warmup=5, rep=200, return_mode="min") * 1e3
