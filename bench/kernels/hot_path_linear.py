# ruff: noqa: B023  (every timed closure runs inside its own loop iteration)
"""bench/kernels/hot_path.py's linear rows: the Triton GEMV (kernels/linear.py) vs cuBLAS at decode batch
sizes, with its tile sweep.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import torch
import torch.nn.functional as F
from hot_path_common import (
    BF16,
    DEV,
    ROWS,
    _err,
    _read_us,
    _us,
)

from engine.testing.synthetic import GEOMETRIES  # noqa: E402
from kernels.linear import MIN_PROGRAMS, GemvTiles, _launch_linear, gemv_tiles, linear_ref  # noqa: E402

# ---- Linear layers: the Triton GEMV (kernels/linear.py) vs cuBLAS at decode batch sizes -----------------------

LINEAR_WORKING_SET = 1 << 30  # distinct weight bytes cycled per timed call (each call misses the 60 MB L2)
LINEAR_MAX_COPIES = 128
LINEAR_TOKENS = (1, 8)
# (BLOCK_N, BLOCK_K in bf16 elements, num_warps, num_stages) tried on every shape, each with the split-K that
# gemv_tiles' rule gives for that tile, half and (for N <= 6144) twice that; the first is gemv_tiles' default.
# BLOCK_N 16 / 32 run mma.sync (also on sm_120), 64 / 128 Hopper's wgmma.
LINEAR_TILE_SWEEP = ((32, 256, 4, 4), (16, 256, 4, 4), (32, 128, 4, 6), (32, 512, 4, 3), (64, 128, 4, 4),
                     (64, 256, 4, 3), (128, 128, 8, 3))  # fmt: skip


def _linear_shapes() -> list[tuple[str, str, int, int, int]]:
    """(geometry, projection, N, K, calls per decode step) for every dense linear of a decode step of the two
    geometries (engine/testing/synthetic.py GEOMETRIES, fused as the loader fuses them; the MTP head not counted);
    shapes that coincide (35B-A3B o_proj and GDN out_proj) are one entry with their calls summed."""
    shapes: dict[tuple[str, int, int], list] = {}
    for geometry in ("qwen3.6-27b", "qwen3.6-35b-a3b"):
        c = GEOMETRIES[geometry]
        hidden, attn, gdn = c.hidden_size, c.num_attention_layers, c.num_linear_layers
        q_out = 2 * c.num_attention_heads * c.head_dim  # query + output gate per head
        kv_out = c.num_key_value_heads * c.head_dim
        entries = [
            ("attn qkv", q_out + 2 * kv_out, hidden, attn),
            ("attn o_proj", hidden, c.num_attention_heads * c.head_dim, attn),
            ("GDN in_proj", c.conv_dim + c.linear_value_dim + 2 * c.linear_num_value_heads, hidden, gdn),
            ("GDN out_proj", hidden, c.linear_value_dim, gdn),
        ]
        if c.is_moe:
            entries.append(("router", c.num_experts, hidden, c.num_hidden_layers))
        else:
            assert c.intermediate_size is not None
            entries += [("MLP gate_up", 2 * c.intermediate_size, hidden, c.num_hidden_layers),
                        ("MLP down", hidden, c.intermediate_size, c.num_hidden_layers)]  # fmt: skip
        entries.append(("lm_head", c.vocab_size, hidden, 1))
        for name, n, k, calls in entries:
            key = (geometry, n, k)
            if key in shapes:
                shapes[key][0] += f" / {name}"
                shapes[key][1] += calls
            else:
                shapes[key] = [name, calls]
    return [(g, name, n, k, calls) for (g, n, k), (name, calls) in shapes.items()]


# --linear-sweep small: the first tiles of LINEAR_TILE_SWEEP, each at its rule's split only
LINEAR_SWEEP_SMALL = 4


def _linear_sweep(n: int, k: int, small: bool = False) -> list[GemvTiles]:
    """The tiles tried on one [N, K] bf16 weight (``LINEAR_TILE_SWEEP`` x splits; see there), default first;
    ``small``: the first ``LINEAR_SWEEP_SMALL`` tiles at the rule's split only (a call of a few minutes)."""
    tried = [gemv_tiles(n, k, BF16)]
    for block_n, block_k, warps, stages in (
        LINEAR_TILE_SWEEP[:LINEAR_SWEEP_SMALL] if small else LINEAR_TILE_SWEEP
    ):
        block_k = min(block_k, max(16, 1 << (k - 1).bit_length()))
        split = 1
        while -(-n // block_n) * split < MIN_PROGRAMS and split < 16 and k % (2 * split * block_k) == 0:
            split *= 2
        splits = {split} if small else {split, max(1, split // 2)}
        if not small and n <= 6144 and k % (2 * split * block_k) == 0:
            splits.add(2 * split)
        tried += [GemvTiles(block_n, block_k, warps, s, stages) for s in sorted(splits)]
    return list(dict.fromkeys(tried))


def _bench_linear_shape(geometry: str, name: str, n: int, k: int, calls: int, read_gbps: float,
                        sweep: str) -> dict[int, tuple[float, float, float]]:  # fmt: skip
    """The rows of one [N, K] weight (see ``bench_linear``); {T: (us per call: GEMV default, best tile, cuBLAS)}."""
    nbytes = n * k * 2
    copies = max(1, min(LINEAR_MAX_COPIES, -(-LINEAR_WORKING_SET // nbytes)))
    weights = torch.randn(copies, n, k, device=DEV, dtype=BF16) * k**-0.5
    default = gemv_tiles(n, k, BF16)
    result = {}
    for tokens in LINEAR_TOKENS:
        shape = f"{geometry} {name} T{tokens} N{n} K{k}"
        x = torch.randn(tokens, k, device=DEV, dtype=BF16)
        out = _launch_linear(x, weights[0], default)  # the GEMV itself, whatever NINFER_GEMV=auto would pick
        check = {**_err(out, linear_ref(x, weights[0])), "tiles": list(default), "copies": copies,
                 "calls_per_step": calls, "read_GBps": round(read_gbps, 1)}  # fmt: skip
        if tokens > 1:
            check["batch_invariant"] = all(
                torch.equal(_launch_linear(x[i : i + 1], weights[0], default)[0], out[i])
                for i in range(tokens)
            )

        def per_layer(fn: Callable[[torch.Tensor], object]) -> float:
            def layers() -> None:
                for w in weights:
                    fn(w)

            layers()
            return _us(layers, graph=True) / copies

        t_cublas = per_layer(lambda w: F.linear(x, w))
        t_gemv = per_layer(lambda w: _launch_linear(x, w, default))
        row = {"op": "linear GEMV (default tiles) vs cuBLAS F.linear", "shape": shape, "kernel_us": round(t_gemv, 2),
               "ref_us": round(t_cublas, 2), "bytes": nbytes, "kernel_GBps": round(nbytes / t_gemv / 1e3, 1),
               "cublas_GBps": round(nbytes / t_cublas / 1e3, 1),
               "fraction_of_read": round(nbytes / t_gemv / 1e3 / read_gbps, 3),
               "cublas_fraction_of_read": round(nbytes / t_cublas / 1e3 / read_gbps, 3),
               "speedup_vs_cublas": round(t_cublas / t_gemv, 3), **check}  # fmt: skip
        ROWS.append(row)
        print(json.dumps(row), flush=True)
        best: tuple[float, GemvTiles] = (t_gemv, default)
        for tiles in _linear_sweep(n, k, small=sweep == "small")[1:] if sweep != "none" else []:
            err = _err(_launch_linear(x, weights[0], tiles), linear_ref(x, weights[0]))
            t = per_layer(lambda w: _launch_linear(x, w, tiles))
            ROWS.append({"op": f"linear GEMV sweep BLOCK_N={tiles.block_n} BLOCK_K={tiles.block_k} "
                         f"warps={tiles.num_warps} split={tiles.split_k} stages={tiles.num_stages}",
                         "shape": shape, "kernel_us": round(t, 2), "ref_us": round(t_cublas, 2), "bytes": nbytes,
                         "kernel_GBps": round(nbytes / t / 1e3, 1), "tiles": list(tiles),
                         "speedup_vs_cublas": round(t_cublas / t, 3), **err})  # fmt: skip
            print(json.dumps(ROWS[-1]), flush=True)
            best = min(best, (t, tiles))
        if sweep != "none":
            ROWS.append({"op": "linear GEMV best tile", "shape": shape, "kernel_us": round(best[0], 2),
                         "ref_us": round(t_cublas, 2), "bytes": nbytes, "kernel_GBps": round(nbytes / best[0] / 1e3, 1),
                         "tiles": list(best[1]), "is_default": best[1] == default,
                         "speedup_vs_cublas": round(t_cublas / best[0], 3)})  # fmt: skip
            print(json.dumps(ROWS[-1]), flush=True)
        result[tokens] = (t_gemv, best[0], t_cublas)
    return result


def bench_linear(sweep: str, only: str = "") -> None:
    """Every dense decode linear of 27B and 35B-A3B (``_linear_shapes``) at T = 1 and 8: the Triton GEMV
    (``linear``, gemv_tiles' default) against cuBLAS ``F.linear``, both as CUDA-graph replays over enough
    distinct copies of the weight (``LINEAR_WORKING_SET``) that every call reads its weight from HBM, as a
    decode step's layers do; time per call ("per layer"), bytes = the weight's, fraction of the measured read
    bandwidth. Each row checks the kernel against ``linear_ref`` and, at T=8, that every row is bitwise the
    row run alone. With ``sweep`` "small" or "full" (``--linear-only``, ``--linear-sweep``) the tile sweep
    (``_linear_sweep``) per shape and T and the best tile per shape. Last, per geometry and T, one decode step's dense linears summed (calls x us
    per call: GEMV default, best tile, cuBLAS): the numbers that decide whether ``NINFER_GEMV=auto`` stays the
    default and which tiles ``gemv_tiles`` should pick. ``only``: the shapes whose "geometry projection"
    contains it (all when empty), to split the sweep over several calls."""
    read_us = _read_us()
    read_gbps = (1 << 31) / read_us / 1e3
    ROWS.append({"op": "read bandwidth (fp32 sum)", "shape": "2 GiB", "kernel_us": round(read_us, 2),
                 "ref_us": None, "bytes": 1 << 31, "kernel_GBps": round(read_gbps, 1)})  # fmt: skip
    print(json.dumps(ROWS[-1]), flush=True)
    step: dict[tuple[str, int], list[float]] = {}
    for geometry, name, n, k, calls in _linear_shapes():
        if only not in f"{geometry} {name}":
            continue
        times = _bench_linear_shape(geometry, name, n, k, calls, read_gbps, sweep)
        torch.cuda.empty_cache()
        for tokens, per_call in times.items():
            totals = step.setdefault((geometry, tokens), [0.0, 0.0, 0.0])
            for i, t in enumerate(per_call):
                totals[i] += calls * t
    for (geometry, tokens), (gemv, best, cublas) in step.items():
        ROWS.append({"op": "linear: one decode step's dense linears (sum of calls x us per call)",
                     "shape": f"{geometry} T{tokens}", "kernel_us": round(gemv, 1), "ref_us": round(cublas, 1),
                     "bytes": 0, "kernel_GBps": 0.0, "best_tiles_us": round(best, 1),
                     "saved_ms_per_step_default": round((cublas - gemv) / 1e3, 3),
                     "saved_ms_per_step_best": round((cublas - best) / 1e3, 3)})  # fmt: skip
        print(json.dumps(ROWS[-1]), flush=True)
