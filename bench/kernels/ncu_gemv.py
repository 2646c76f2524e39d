"""A driver for Nsight Compute: the one-row quantized decode GEMV (the Gluon "pairs" kernel on the GEMV layout)
and cuBLAS bf16 at two 27B shapes (MLP gate_up Q4 [34816, 5120], MLP down Q5 [5120, 17408]), each launched a
few times on weights far larger than L2, so ncu can report where the GEMV's time goes (DRAM throughput, warp
stall reasons, occupancy) against cuBLAS reading the same rows in bf16.

    ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
        --section Occupancy --section LaunchStats -k regex:'pairs|nvjet|reduce' python3 bench/kernels/ncu_gemv.py

Without ncu it times each call with CUDA events (a sanity check that the weights stream from HBM).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.kernels.quant import random_payload  # noqa: E402
from kernels.quant import Q4, Q5, quant_linear, view_planes  # noqa: E402

SHAPES = [("MLP gate_up", 34816, 5120, Q4), ("MLP down", 5120, 17408, Q5)]
CALLS = 2  # launches a shape (the second one's weight is another copy: no L2 reuse)


def main() -> None:
    torch.manual_seed(0)
    for name, n, k, fmt in SHAPES:
        weights = [view_planes(fmt, random_payload(fmt, n, k), (n, k), repack=True) for _ in range(CALLS)]
        dense = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(CALLS)]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        for label, group in (("pairs", weights), ("cublas", dense)):
            for w in group:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                if label == "pairs":
                    quant_linear(x, w, route="gemv")
                else:
                    F.linear(x, w)
                end.record()
                torch.cuda.synchronize()
                print(f"{name} {fmt} {label}: {start.elapsed_time(end) * 1e3:.1f} us", flush=True)


if __name__ == "__main__":
    main()
