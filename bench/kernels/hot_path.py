"""Time the hot-path Triton kernels against their torch references (and fla-core where it applies) at
the real Qwen3.6-27B geometry, on one GPU. Small decode kernels are timed as CUDA-graph replays
(``triton.testing.do_bench_cudagraph``), so launch overhead is excluded; references (which sync) are
timed eagerly. Writes one JSON (``--json``) with date, GPU, commit and every row. This file is the driver
(flags, order, the JSON); the rows come from its siblings, one per op family: hot_path_small.py (norms,
activations, conv, GDN, RoPE), hot_path_attention.py, hot_path_moe.py, hot_path_linear.py, sharing
hot_path_common.py (geometry, timing helpers, ``ROWS``).

    python bench/kernels/hot_path.py --json bench/results/kernels_h200_<date>.json
    python bench/kernels/hot_path.py --linear-only --json ...  # the Triton GEMV vs cuBLAS + its tile sweep
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
from pathlib import Path

import torch
import triton
from hot_path_attention import bench_attention, bench_prefill_attention
from hot_path_common import ROWS
from hot_path_linear import bench_linear
from hot_path_moe import bench_moe
from hot_path_small import (
    bench_conv_and_gdn_decode,
    bench_gdn_prefill,
    bench_norms,
    bench_prefill_conv,
    bench_rope,
    bench_sigmoid_gate_mul,
    bench_silu_mul,
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--moe-only", action="store_true", help="only the MoE rows (35B-A3B geometry)")
    parser.add_argument(
        "--linear-only",
        action="store_true",
        help="only the linear rows: Triton GEMV vs cuBLAS, tile sweep (27B and 35B-A3B)",
    )
    parser.add_argument("--linear-sweep", default="full", choices=("none", "small", "full"),
                        help="with --linear-only: the tile sweep per shape (small: 4 tiles, rule splits)")  # fmt: skip
    parser.add_argument("--linear-shapes", default="", metavar="SUBSTR",
                        help="with --linear-only: the shapes whose 'geometry projection' contains SUBSTR")  # fmt: skip
    args = parser.parse_args()
    if args.moe_only and args.linear_only:
        parser.error("--moe-only and --linear-only exclude each other")
    torch.manual_seed(0)
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_recurrent
    except ImportError:
        fla_recurrent = None
    if args.linear_only:
        bench_linear(sweep=args.linear_sweep, only=args.linear_shapes)
    elif not args.moe_only:
        bench_norms()
        bench_silu_mul()
        bench_sigmoid_gate_mul()
        bench_conv_and_gdn_decode(fla_recurrent)
        if fla_recurrent is not None:
            bench_gdn_prefill(7680)
        bench_prefill_conv(7680, continued=False)
        bench_prefill_conv(8192, continued=True)  # a long-context chunk continuing from its conv state
        bench_rope(7680)
        bench_attention()
        bench_prefill_attention()
    if not args.linear_only:
        bench_moe()
    if not args.moe_only and not args.linear_only:
        bench_linear(sweep="none")  # the sweep (minutes) only with --linear-only
    commit = (
        os.environ.get("NINFER_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    )
    result = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "commit": commit,
        "software": {
            "torch": torch.__version__,
            "triton": triton.__version__,
            "fla": __import__("fla").__version__ if fla_recurrent else None,
        },  # fmt: skip
        "what": "hot-path Triton kernels vs torch references at the Qwen3.6-27B geometry; kernel times are "
        "median CUDA-graph replays (launch overhead excluded), ref times eager medians; GBps = bytes/time; "
        "MoE rows at the Qwen3.6-35B-A3B geometry",
        "rows": ROWS,
    }
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'op':30s} {'shape':26s} {'kernel us':>10s} {'ref us':>10s} {'GB/s':>8s}")
    for r in ROWS:
        print(
            f"{r['op']:30s} {r['shape']:26s} {r['kernel_us']:10.2f} {str(r['ref_us']):>10s} {r['kernel_GBps']:8.1f}"
        )


if __name__ == "__main__":
    main()
