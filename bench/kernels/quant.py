# ruff: noqa: B023  (every timed closure runs inside its own loop iteration)
"""Time the quantized linear kernels (kernels/quant) against cuBLAS bf16 at the Qwen3.6-27B shapes, on one GPU.

Every dense projection of the 27B as the published profiles fuse it (attention query_key / gate_value
[7168, 5120], GDN query_key [4096, 5120] and value_z [12288, 5120], attention and GDN output [5120, 6144], MLP
gate_up [34816, 5120] and down [5120, 17408], the head [248320, 5120]) in each format a profile stores it in
(groupwise-int: the role's Q4/Q5/Q6; nvfp4; Qwen3.8's FP8 rows), at decode T = 1 and 8 (the Triton GEMV,
CUDA-graph replays over enough distinct weights that each call reads its weight from HBM) and prefill
T = 7,680 (the Triton GEMM; the "dequant" route: bf16 slabs of rows + cuBLAS; FP8 also through
``torch._scaled_mm``, W8A8). Each row: time per call, the
payload's bytes and GB/s (decode) or TFLOP/s (prefill), the fraction of the measured read bandwidth, cuBLAS
``F.linear`` on a bf16 weight of the same shape, and the error against ``quant_linear_ref``; T = 8 rows also
check that each row is bitwise the row run alone.

    python bench/kernels/quant.py --json bench/results/kernels_quant_h200_<date>.json
    python bench/kernels/quant.py --json ... --only "MLP" --formats groupwise --no-prefill --no-moe --sweep all
    python bench/kernels/quant.py --json ... --only "attn query_key,MLP down" --no-prefill --no-moe --rep 20 \
        --sweep nosplit,p2048,n16,b2x

Groupwise formats (Q4/Q5/Q6/W8) are timed twice at decode, side by side: the stored layout's GEMV (old:
``triton_group.py``) and the GEMV layout's (new: ``triton_gemv.py``, the weight repacked at load by
``view_planes(..., repack=True)``); each row prints GB/s and the percentage of 4.8 TB/s (the H200's read
bandwidth) for both, and the time 80% of it would take, for bytes = payload + x. ``--variants NAMES``
(``all``: every one of ``kernels.quant.packed_linear.GEMV_VARIANTS``) times the new GEMV's tile variants too
(the "fma" one at T = 1 only), to fill ``GEMV_TABLE`` from one run:

    python bench/kernels/quant.py --json ... --formats groupwise --no-prefill --no-moe --rep 20 --variants all

``--sweep NAMES`` also times the old GEMV with the named alternatives of ``SWEEP`` (``all``: every one); each is
``gemv_tiles`` with other arguments (rows a program, code bytes a step, warps, stages, the program count that
sets split K), so every candidate is a valid split of that shape. The JSON is rewritten after every row (a
run cut off by a time limit keeps what it measured).

Last, the 35B-A3B's quantized routed experts at decode (``quant_moe_experts`` v1 and v2, ``NINFER_QUANT_MOE``, vs
bf16 ``moe_experts``), alone with ``--moe-only``; ``--moe-variants all`` times v2's tile alternatives too:

    python bench/kernels/quant.py --json bench/results/quant_moe_h200_<date>.json --moe-only --moe-variants all

And the 35B-A3B's routed experts at prefill (T = 128, 1024, 7680), one layer: ``NINFER_MOE_PREFILL=scratch`` (the
banks dequantized into a bf16 scratch + the dense grouped GEMMs) vs ``quant`` (the grouped GEMM on the quantized
banks, ``kernels/quant/moe_prefill.py``), alone with ``--moe-prefill-only``; ``--moe-prefill-variants all`` times
the grouped GEMM's tile alternatives too:

    python bench/kernels/quant.py --json bench/results/quant_moe_prefill_h200_<date>.json --moe-prefill-only \
        --moe-prefill-variants all
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.model.mlp import _experts_grouped, expert_groups  # noqa: E402
from kernels.moe import moe_experts, moe_route_ref  # noqa: E402
from kernels.quant import (  # noqa: E402
    FP8,
    GROUP_FORMATS,
    NVFP4,
    Q4,
    Q5,
    Q6,
    QUANT_MOE_V2_VARIANTS,
    QuantWeight,
    gemm_tiles,
    gemv_tiles,
    geometry,
    quant_linear,
    quant_linear_ref,
    quant_moe_experts,
    quant_moe_experts_ref,
    quant_moe_tiles,
    quant_moe_tiles_v2,
    view_planes,
)
from kernels.quant.moe_prefill import (  # noqa: E402
    QUANT_MOE_GROUPED_VARIANTS,
    quant_moe_grouped,
    quant_moe_grouped_tiles,
)
from kernels.quant.packed_linear import GEMV_VARIANTS, packed_tiles  # noqa: E402
from kernels.quant.quant_linear import dequantize_to, one_row_ok, one_row_tiles  # noqa: E402

DEV = "cuda"
BF16 = torch.bfloat16
PREFILL_TOKENS = 7680
WORKING_SET = 2 << 30  # distinct weights per decode timing: at least this many payload bytes (HBM, not L2)
MAX_COPIES = 64
ROWS: list[dict] = []
HEADER: dict = {}  # {"path": the --json file, "meta": its fields but the rows}

# (projection, N, K, groupwise-int format, calls per 27B decode step): the upstream 27B inventory's fused parents
SHAPES = [
    ("attn query_key", 7168, 5120, Q4, 16),
    ("attn gate_value", 7168, 5120, Q5, 16),
    ("attn output", 5120, 6144, Q5, 16),
    ("GDN query_key", 4096, 5120, Q4, 48),
    ("GDN value_z", 12288, 5120, Q5, 48),
    ("GDN output", 5120, 6144, Q5, 48),
    ("MLP gate_up", 34816, 5120, Q4, 64),
    ("MLP down", 5120, 17408, Q5, 64),
    ("lm_head", 248320, 5120, Q6, 1),
]


def random_payload(fmt: str, n: int, k: int) -> torch.Tensor:
    """A valid random payload of ``fmt`` [n, k] built on the GPU (no encoder pass): random codes, scales that
    give weights of magnitude ~k^-0.5, zero padding where the layout has it, NVFP4 divisor 1.0."""
    geo = geometry(fmt, (n, k))
    payload = torch.zeros(geo.payload_bytes, dtype=torch.uint8, device=DEV)
    codes = torch.randint(0, 256, (n, geo.codes_row_bytes), dtype=torch.uint8, device=DEV)
    if fmt in GROUP_FORMATS:
        spec = GROUP_FORMATS[fmt]
        if spec.bits == 8:
            codes[codes == 0x80] = 0x81  # W8 never holds -128
        lanes = geo.k_pad if spec.bits == 8 else geo.k_pad // 2
        codes[:, (k if spec.bits == 8 else (k + 1) // 2) : lanes] = 0
        payload[: geo.codes_bytes] = codes.reshape(-1)
        if geo.high_bytes:
            payload[geo.high_offset : geo.high_offset + geo.high_bytes] = torch.randint(
                0, 256, (geo.high_bytes,), dtype=torch.uint8, device=DEV
            )
        scales = torch.rand(n, geo.groups_per_row, device=DEV) * 2 * k**-0.5 / spec.qmax
        payload[geo.scales_offset :] = scales.half().reshape(-1).view(torch.uint8)
    elif fmt == NVFP4:
        payload[: geo.codes_bytes] = codes.reshape(-1)
        scales = torch.randint(0x18, 0x28, (geo.scales_bytes,), dtype=torch.uint8, device=DEV)  # 2^-4 .. 2^-2
        payload[geo.scales_offset : geo.divisor_offset] = scales
        payload[geo.divisor_offset :] = torch.tensor([1.0], device=DEV).view(torch.uint8)
    else:
        codes[(codes & 0x7F) == 0x7F] = 0x7E  # no NaN words
        payload[: geo.codes_bytes] = codes.reshape(-1)
        scales = torch.rand(n, device=DEV) * 2 * k**-0.5 / 448
        payload[geo.scales_offset :] = scales.to(BF16).view(torch.uint8)
    return payload


REP_MS = 100  # do_bench_cudagraph's replay length (--rep)
PEAK_GBPS = 4800.0  # the H200's read bandwidth (HBM3e), the percentages' base
TARGET = 0.8  # the goal: 80% of it


def _us(fn: Callable[[], object]) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=REP_MS, return_mode="median") * 1e3


def _read_gbps() -> float:
    x = torch.empty(1 << 29, device=DEV).uniform_()
    return (1 << 31) / (triton.testing.do_bench(x.sum, warmup=5, rep=200, return_mode="min") * 1e3) / 1e3


def _err(actual: torch.Tensor, expected: torch.Tensor) -> dict:
    a, b = actual.double(), expected.double()
    rel = ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()).item()
    return {"max_abs_err": float(f"{(a - b).abs().max().item():.3e}"), "rel_rms_err": float(f"{rel:.3e}")}


def _emit(row: dict) -> None:
    ROWS.append(row)
    print(json.dumps(row), flush=True)
    if HEADER:
        HEADER["path"].write_text(json.dumps({**HEADER["meta"], "rows": ROWS}, indent=1) + "\n")


def _per_call(fn: Callable[[object], object], weights: list) -> float:
    def layers() -> None:
        for w in weights:
            fn(w)

    layers()
    return _us(layers) / len(weights)


# GEMV tile alternatives: gemv_tiles' keyword arguments (block_n, step_bytes: code bytes a row a step, the
# default being 128 for Q4 / NVFP4 (256 weights) and 512 for FP8; num_warps; num_stages; min_programs: split K
# until the grid has this many programs). "default" is gemv_tiles' choice; "nosplit" shows what split K gives.
SWEEP: dict[str, dict] = {
    "nosplit": dict(min_programs=1),
    "p512": dict(min_programs=512),
    "p2048": dict(min_programs=2048),
    "st2": dict(num_stages=2),
    "st1": dict(num_stages=1),
    "n16": dict(block_n=16, min_programs=2048),
    "n64w8": dict(block_n=64, num_warps=8, num_stages=3, min_programs=512),
    "b2x": dict(step_bytes=256, num_stages=2),
    "bhalf": dict(step_bytes=64, min_programs=2048),
    "w2": dict(num_warps=2, num_stages=2, min_programs=2048),
}


def _pct(nbytes: int, us: float) -> dict:
    gbps = nbytes / us / 1e3
    return {"GBps": round(gbps, 1), "pct_of_4.8TBps": round(100 * gbps / PEAK_GBPS, 1)}


def bench_decode(
    name: str, fmt: str, n: int, k: int, read_gbps: float, sweep: list[str], variants: list[str]
) -> dict[int, float]:
    """The GEMV rows of one projection and format; {T: us per call (the GEMV quant_linear runs: new for
    groupwise formats, else the format's one)}."""
    nbytes = geometry(fmt, (n, k)).payload_bytes
    copies = max(1, min(MAX_COPIES, -(-WORKING_SET // nbytes)))
    payloads = [random_payload(fmt, n, k) for _ in range(copies)]
    weights = [view_planes(fmt, p, (n, k), divisor=1.0) for p in payloads]
    grouped = fmt in GROUP_FORMATS
    packed = [view_planes(fmt, p.clone(), (n, k), repack=True) for p in payloads] if grouped else []
    dense_copies = max(1, min(MAX_COPIES, -(-WORKING_SET // (2 * n * k))))
    dense = [torch.randn(n, k, device=DEV, dtype=BF16) * k**-0.5 for _ in range(dense_copies)]
    default = gemv_tiles(fmt, n, k)
    times = {}
    for tokens in (1, 8):
        x = torch.randn(tokens, k, device=DEV, dtype=BF16)
        read = nbytes + x.numel() * x.element_size()
        target_us = read / (TARGET * PEAK_GBPS * 1e3)
        expected = quant_linear_ref(x, weights[0])
        out = quant_linear(x, weights[0], route="gemv")
        check = {**_err(out, expected), "tiles": list(default), "copies": copies}
        if tokens > 1:
            check["batch_invariant"] = all(
                torch.equal(quant_linear(x[i : i + 1], weights[0], route="gemv")[0], out[i])
                for i in range(tokens)
            )
        t = _per_call(lambda w: quant_linear(x, w, route="gemv"), weights)
        t_cublas = _per_call(lambda w: F.linear(x, w), dense)
        times[tokens] = t
        gbps = nbytes / t / 1e3
        _emit({"op": f"quant GEMV {fmt}" + (" old (stored layout)" if grouped else ""),
               "shape": f"27B {name} T{tokens} N{n} K{k}", "kernel_us": round(t, 2),
               "bytes": nbytes, "kernel_GBps": round(gbps, 1), "fraction_of_read": round(gbps / read_gbps, 3),
               "cublas_bf16_us": round(t_cublas, 2), "cublas_bf16_GBps": round(2 * n * k / t_cublas / 1e3, 1),
               "speedup_vs_cublas_bf16": round(t_cublas / t, 3), **check})  # fmt: skip
        if grouped:
            out_new = quant_linear(x, packed[0], route="gemv")
            t_new = _per_call(lambda w: quant_linear(x, w, route="gemv"), packed)
            times[tokens] = t_new
            new_check = _err(out_new, expected)
            if tokens > 1:
                new_check["batch_invariant"] = all(
                    torch.equal(quant_linear(x[i : i + 1], packed[0], route="gemv")[0], out_new[i])
                    for i in range(tokens)
                )
            old, new = _pct(read, t), _pct(read, t_new)
            _emit({"op": f"quant GEMV {fmt} old vs new", "shape": f"27B {name} T{tokens} N{n} K{k}",
                   "bytes_read": read, "target_us_80pct": round(target_us, 2),
                   "old_us": round(t, 2), "old_GBps": old["GBps"], "old_pct": old["pct_of_4.8TBps"],
                   "new_us": round(t_new, 2), "new_GBps": new["GBps"], "new_pct": new["pct_of_4.8TBps"],
                   "speedup": round(t / t_new, 2), "new_tiles": list(packed_tiles(fmt, n, k)),
                   "cublas_bf16_us": round(t_cublas, 2), **new_check})  # fmt: skip
            print(f"  {fmt:<11} {name:<16} T{tokens}: old {t:8.2f} us {old['GBps']:7.1f} GB/s {old['pct_of_4.8TBps']:5.1f}%"
                  f" | new {t_new:8.2f} us {new['GBps']:7.1f} GB/s {new['pct_of_4.8TBps']:5.1f}%"
                  f" | 80% target {target_us:7.2f} us", flush=True)  # fmt: skip
            for label in variants:
                tiles = packed_tiles(fmt, n, k, label)
                if tiles.mode not in ("dot", "mma", "mma_ring") and tokens > 1:
                    continue  # the one-row modes
                t_v = _per_call(lambda w: quant_linear(x, w, route="gemv", tiles=tiles), packed)
                v = _pct(read, t_v)
                _emit({"op": f"quant GEMV {fmt} new variant", "shape": f"27B {name} T{tokens} N{n} K{k}",
                       "variant": label, "tiles": list(tiles), "kernel_us": round(t_v, 2), "GBps": v["GBps"],
                       "pct_of_4.8TBps": v["pct_of_4.8TBps"], "vs_new_default": round(t_new / t_v, 3),
                       **_err(quant_linear(x, packed[0], route="gemv", tiles=tiles), expected)})  # fmt: skip
                print(f"      variant {label:<9} {t_v:8.2f} us {v['GBps']:7.1f} GB/s {v['pct_of_4.8TBps']:5.1f}%"
                      f"  {list(tiles)}", flush=True)  # fmt: skip
        if tokens == 1 and fmt in (NVFP4, FP8) and one_row_ok(x, weights[0]):
            # the one-row Gluon GEMV both ways (NINFER_FP_ONE_ROW): the register prefetch and the cp.async ring
            for mode in ("rows", "ring"):
                tiles = one_row_tiles(fmt, n, k, mode)
                t_m = _per_call(lambda w: quant_linear(x, w, route="gemv", tiles=tiles), weights)
                m = _pct(read, t_m)
                _emit({"op": f"quant GEMV {fmt} one-row {mode}", "shape": f"27B {name} T1 N{n} K{k}",
                       "tiles": list(tiles), "kernel_us": round(t_m, 2), "GBps": m["GBps"],
                       "pct_of_4.8TBps": m["pct_of_4.8TBps"], "target_us_80pct": round(target_us, 2),
                       **_err(quant_linear(x, weights[0], route="gemv", tiles=tiles), expected)})  # fmt: skip
                print(f"      one-row {mode:<5} {t_m:8.2f} us {m['GBps']:7.1f} GB/s {m['pct_of_4.8TBps']:5.1f}%"
                      f"  {list(tiles)}", flush=True)  # fmt: skip
        for label in sweep:
            tiles = gemv_tiles(fmt, n, k, **SWEEP[label])
            t_s = _per_call(lambda w: quant_linear(x, w, route="gemv", tiles=tiles), weights)
            _emit({"op": f"quant GEMV {fmt} sweep", "shape": f"27B {name} T{tokens} N{n} K{k}",
                   "sweep": label, "kernel_us": round(t_s, 2), "bytes": nbytes,
                   "kernel_GBps": round(nbytes / t_s / 1e3, 1), "fraction_of_read": round(nbytes / t_s / 1e3 / read_gbps, 3),
                   "tiles": list(tiles), "vs_default": round(t / t_s, 3),
                   **_err(quant_linear(x, weights[0], route="gemv", tiles=tiles), out)})  # fmt: skip
    return times


def bench_prefill(name: str, fmt: str, n: int, k: int) -> None:
    qw: QuantWeight = view_planes(fmt, random_payload(fmt, n, k), (n, k), divisor=1.0)
    x = torch.randn(PREFILL_TOKENS, k, device=DEV, dtype=BF16)
    flops = 2.0 * PREFILL_TOKENS * n * k
    w = torch.randn(n, k, device=DEV, dtype=BF16) * k**-0.5
    t_cublas = _us(lambda: F.linear(x, w))
    routes = ["gemm", "dequant", "scaled_mm"] if fmt == FP8 else ["gemm", "dequant"]
    for route in routes:
        out = quant_linear(x, qw, route=route)
        check = _err(out[:256], quant_linear_ref(x[:256], qw))
        t = _us(lambda: quant_linear(x, qw, route=route))
        _emit({"op": f"quant {route} {fmt}", "shape": f"27B {name} T{PREFILL_TOKENS} N{n} K{k}",
               "kernel_us": round(t, 1), "TFLOPs": round(flops / t / 1e6, 1),
               "cublas_bf16_us": round(t_cublas, 1), "cublas_bf16_TFLOPs": round(flops / t_cublas / 1e6, 1),
               "speedup_vs_cublas_bf16": round(t_cublas / t, 3),
               "tiles": list(gemm_tiles(fmt, n, k, PREFILL_TOKENS)) if route == "gemm" else None, **check})  # fmt: skip
        del out


MOE_BYTES_PER_S = 4.0e12  # the bandwidth the MoE rows' "at 4 TB/s" time assumes
MOE_GEOMETRY = (256, 2048, 512, 8)  # 35B-A3B: experts, hidden, moe_intermediate_size, top_k


def bench_moe(read_gbps: float, variants: list[str]) -> None:
    """The 35B-A3B routed experts at decode (T = 1, 8; E 256, H 2048, I 512, top_k 8): ``quant_moe_experts`` v1
    and v2 (``NINFER_QUANT_MOE``; v2 also with the tile ``variants`` of ``QUANT_MOE_V2_VARIANTS`` on the Q5 stacks)
    on the profile's Q4 gate_up with Q5 and Q6 down stacks, against ``kernels.moe.moe_experts`` on bf16 experts, over
    distinct layers (each call reads its experts from HBM), the quantized kernels with the shared expert's gated
    term added inside (as decode runs them); bytes = the chosen experts' payload (the distinct ones of the step),
    and the time those bytes take at 4 TB/s. Each v2 row checks v2 against the reference and
    that every row of T = 8 is bitwise the row alone."""
    experts, hidden, inter, top_k = MOE_GEOMETRY
    layers = 4
    dense = [
        (torch.randn(experts, 2 * inter, hidden, device=DEV, dtype=BF16) * hidden**-0.5,
         torch.randn(experts, hidden, inter, device=DEV, dtype=BF16) * inter**-0.5)
        for _ in range(2)
    ]  # fmt: skip
    for down_fmt in (Q5, Q6):
        stacks = [
            (
                view_planes(
                    Q4, random_payload(Q4, experts * 2 * inter, hidden), (experts * 2 * inter, hidden)
                ),
                view_planes(
                    down_fmt, random_payload(down_fmt, experts * hidden, inter), (experts * hidden, inter)
                ),
            )
            for _ in range(layers)
        ]
        per_expert = (
            geometry(Q4, (2 * inter, hidden)).payload_bytes
            + geometry(down_fmt, (hidden, inter)).payload_bytes
        )
        for tokens in (1, 8):
            x = torch.randn(tokens, hidden, device=DEV, dtype=BF16)
            weights, ids = moe_route_ref(torch.randn(tokens, experts, device=DEV), top_k)
            # the shared expert's ungated output and its gate's weight, added inside the kernels as the model runs
            # them by default (NINFER_QUANT_MOE_SHARED=fused)
            shared = torch.randn(tokens, hidden, device=DEV, dtype=BF16)
            score = torch.randn(1, hidden, device=DEV, dtype=BF16) * hidden**-0.5
            expected = quant_moe_experts_ref(x, *stacks[0], weights, ids, shared, score)
            nbytes = per_expert * ids.unique().numel()
            t_bf16 = _per_call(lambda d: moe_experts(x, *d, weights, ids), dense)
            shape = f"35B-A3B Q4/{down_fmt} T{tokens} E256 H2048 I512 top8"
            # the tile variants on the Q5 stacks (the profile's common layers); Q6 (3 layers) with the defaults
            runs = [("v1", "default")] + [
                ("v2", name) for name in (variants if down_fmt == Q5 else ["default"])
            ]
            times: dict[tuple[str, str], float] = {}
            for version, name in runs:
                tiles = None
                if version == "v2":
                    tiles = quant_moe_tiles_v2(
                        stacks[0][0].k_pad, stacks[0][1].k_pad, **QUANT_MOE_V2_VARIANTS[name]
                    )

                def call(st: tuple[QuantWeight, QuantWeight]) -> torch.Tensor:
                    return quant_moe_experts(
                        x, *st, weights, ids, shared, score, version=version, tiles_v2=tiles
                    )

                out = call(stacks[0])
                check = _err(out, expected)
                if tokens > 1:
                    check["batch_invariant"] = all(
                        torch.equal(
                            quant_moe_experts(x[i : i + 1], *stacks[0], weights[i : i + 1], ids[i : i + 1],
                                              shared[i : i + 1], score, version=version, tiles_v2=tiles)[0],
                            out[i],
                        )
                        for i in range(tokens)
                    )  # fmt: skip
                t = _per_call(call, stacks)
                times[(version, name)] = t
                _emit({"op": f"quant MoE experts {version}", "variant": name, "shape": shape,
                       "tiles": list(tiles) if tiles else list(quant_moe_tiles(hidden, inter)),
                       "kernel_us": round(t, 2), "bytes": nbytes, "kernel_GBps": round(nbytes / t / 1e3, 1),
                       "us_at_4TBps": round(nbytes / MOE_BYTES_PER_S * 1e6, 2),
                       "fraction_of_read": round(nbytes / t / 1e3 / read_gbps, 3),
                       "bf16_moe_experts_us": round(t_bf16, 2), "speedup_vs_bf16": round(t_bf16 / t, 3),
                       "speedup_vs_v1": round(times[("v1", "default")] / t, 3), **check})  # fmt: skip
            best = min((t, name) for (version, name), t in times.items() if version == "v2")
            print(f"  MoE {shape}: v1 {times[('v1', 'default')]:.2f} us, best v2 {best[1]} {best[0]:.2f} us, "
                  f"bf16 {t_bf16:.2f} us, {nbytes / MOE_BYTES_PER_S * 1e6:.2f} us at 4 TB/s", flush=True)  # fmt: skip
        del stacks
        torch.cuda.empty_cache()


MOE_PREFILL_TOKENS = (128, 1024, 7680)


def bench_moe_prefill(variants: list[str]) -> None:
    """The 35B-A3B routed experts at prefill (T = 128, 1024, 7680; E 256, H 2048, I 512, top_k 8), one layer a call
    (Q4 gate_up, Q5 or Q6 down; random routing, the shared expert's output added in ``moe_combine``): today's
    ``NINFER_MOE_PREFILL=scratch`` (``QuantExperts``' path: gate_up dequantized into a bf16 scratch, the dense
    grouped path ``_experts_grouped`` with the down bank dequantized into the same memory after the gate_up GEMM)
    against ``quant`` (``quant_moe_grouped``: the grouped GEMM on the quantized stacks; the default tiles and the
    named ``QUANT_MOE_GROUPED_VARIANTS``). Both include the routing's grouping (``expert_groups``). Each row: us a
    layer, x 40 layers, TFLOP/s of the experts' GEMMs, and the error against the scratch path's output (both round
    the weights to bf16 once; quant skips the rounding of gate and up before the activation)."""
    experts, hidden, inter, top_k = MOE_GEOMETRY
    scratch = torch.empty(experts * 2 * inter * hidden, dtype=BF16, device=DEV)
    gu_shape, dn_shape = (experts * 2 * inter, hidden), (experts * hidden, inter)
    gate_up = view_planes(Q4, random_payload(Q4, *gu_shape), gu_shape)
    for down_fmt in (Q5, Q6):
        down = view_planes(down_fmt, random_payload(down_fmt, *dn_shape), dn_shape)

        def dense_down() -> torch.Tensor:
            return dequantize_to(down, BF16, scratch[: experts * hidden * inter].view(-1, inter)).view(
                experts, hidden, inter
            )

        def scratch_path(x, weights, ids, shared) -> torch.Tensor:  # noqa: ANN001
            bank = dequantize_to(gate_up, BF16, scratch.view(-1, hidden)).view(experts, 2 * inter, hidden)
            return _experts_grouped(x, bank, dense_down, weights, ids, shared)

        for tokens in MOE_PREFILL_TOKENS:
            x = torch.randn(tokens, hidden, device=DEV, dtype=BF16)
            shared = torch.randn(tokens, hidden, device=DEV, dtype=BF16) * 0.1
            weights, ids = moe_route_ref(torch.randn(tokens, experts, device=DEV), top_k)
            flop = 2 * tokens * top_k * 3 * hidden * inter
            shape = f"35B-A3B Q4/{down_fmt} T{tokens} E256 H2048 I512 top8"
            expected = scratch_path(x, weights, ids, shared)
            t_scratch = _us(lambda: scratch_path(x, weights, ids, shared))
            _emit({"op": "quant MoE prefill scratch", "shape": shape, "layer_us": round(t_scratch, 1),
                   "x40_layers_ms": round(40 * t_scratch / 1e3, 2),
                   "TFLOPs": round(flop / t_scratch / 1e6, 1)})  # fmt: skip
            for name in variants:
                tiles = quant_moe_grouped_tiles(tokens * top_k, experts)._replace(
                    **QUANT_MOE_GROUPED_VARIANTS[name]
                )

                def quant_path() -> torch.Tensor:
                    groups = expert_groups(ids, experts)
                    return quant_moe_grouped(x, gate_up, down, weights, ids, groups, shared, tiles=tiles)

                check = _err(quant_path(), expected)
                t = _us(quant_path)
                _emit({"op": "quant MoE prefill quant", "variant": name, "shape": shape, "tiles": list(tiles),
                       "layer_us": round(t, 1), "x40_layers_ms": round(40 * t / 1e3, 2),
                       "TFLOPs": round(flop / t / 1e6, 1), "speedup_vs_scratch": round(t_scratch / t, 3),
                       **check})  # fmt: skip
                print(
                    f"  MoE prefill {shape} {name}: scratch {t_scratch:.1f} us, quant {t:.1f} us", flush=True
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument(
        "--only", default="", metavar="SUBSTRS", help="comma list: the projections whose name contains one"
    )
    parser.add_argument("--formats", default="groupwise,NVFP4,FP8_E4M3FN_ROW_BF16S",
                        help="comma list: 'groupwise' (each role's Q4/Q5/Q6), format names")  # fmt: skip
    parser.add_argument("--no-prefill", action="store_true", help="decode rows only")
    parser.add_argument("--no-decode", action="store_true", help="prefill rows only")
    parser.add_argument(
        "--sweep",
        default="",
        metavar="NAMES",
        help=f"comma list of GEMV tile alternatives to time too, or 'all': {', '.join(SWEEP)}",
    )
    parser.add_argument(
        "--variants",
        default="",
        metavar="NAMES",
        help=f"comma list of the new GEMV's tile variants to time too, or 'all': {', '.join(GEMV_VARIANTS)}",
    )
    parser.add_argument("--rep", type=int, default=100, help="ms of CUDA-graph replay a timing (default 100)")
    parser.add_argument("--no-moe", action="store_true", help="skip the 35B-A3B quantized MoE rows")
    parser.add_argument("--moe-only", action="store_true", help="only the 35B-A3B quantized MoE rows")
    parser.add_argument(
        "--moe-prefill-only", action="store_true", help="only the 35B-A3B MoE prefill rows (scratch vs quant)"
    )
    parser.add_argument(
        "--moe-prefill-variants",
        default="default",
        metavar="NAMES",
        help=f"comma list of grouped-GEMM tile variants, or 'all': {', '.join(QUANT_MOE_GROUPED_VARIANTS)}",
    )
    parser.add_argument(
        "--moe-variants",
        default="default",
        metavar="NAMES",
        help=f"comma list of v2 MoE tile variants, or 'all': {', '.join(QUANT_MOE_V2_VARIANTS)}",
    )
    args = parser.parse_args()
    moe_variants = (
        list(QUANT_MOE_V2_VARIANTS)
        if args.moe_variants == "all"
        else [v for v in args.moe_variants.split(",") if v]
    )
    if any(v not in QUANT_MOE_V2_VARIANTS for v in moe_variants):
        parser.error(f"--moe-variants: unknown {set(moe_variants) - set(QUANT_MOE_V2_VARIANTS)}")
    prefill_variants = (
        list(QUANT_MOE_GROUPED_VARIANTS)
        if args.moe_prefill_variants == "all"
        else [v for v in args.moe_prefill_variants.split(",") if v]
    )
    if any(v not in QUANT_MOE_GROUPED_VARIANTS for v in prefill_variants):
        parser.error(
            f"--moe-prefill-variants: unknown {set(prefill_variants) - set(QUANT_MOE_GROUPED_VARIANTS)}"
        )
    global REP_MS
    REP_MS = args.rep
    sweep = list(SWEEP) if args.sweep == "all" else [name for name in args.sweep.split(",") if name]
    unknown = [name for name in sweep if name not in SWEEP]
    if unknown:
        parser.error(f"--sweep: unknown {unknown} (known: {', '.join(SWEEP)}, all)")
    variants = list(GEMV_VARIANTS) if args.variants == "all" else [v for v in args.variants.split(",") if v]
    if any(v not in GEMV_VARIANTS for v in variants):
        parser.error(
            f"--variants: unknown {set(variants) - set(GEMV_VARIANTS)} (known: {', '.join(GEMV_VARIANTS)})"
        )
    commit = (
        os.environ.get("NINFER_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    )
    HEADER["path"] = args.json
    HEADER["meta"] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "commit": commit,
        "software": {"torch": torch.__version__, "triton": triton.__version__},
        "what": "quantized GEMV (T=1, 8; groupwise: old stored-layout vs new GEMV-layout kernel) and GEMM (T=7680) "
        "vs cuBLAS bf16 at the Qwen3.6-27B shapes; times are "
        f"median CUDA-graph replays ({REP_MS} ms); decode rows over distinct weights (HBM reads)",
        "argv": sys.argv[1:],
    }
    torch.manual_seed(0)
    wanted = args.formats.split(",")
    read_gbps = _read_gbps()
    _emit({"op": "read bandwidth (fp32 sum)", "shape": "2 GiB", "kernel_GBps": round(read_gbps, 1)})
    step: dict[tuple[str, int], float] = {}
    if args.moe_prefill_only:
        bench_moe_prefill(prefill_variants)
        return
    for name, n, k, group_fmt, calls in [] if args.moe_only else SHAPES:
        if args.only and not any(part in name for part in args.only.split(",")):
            continue
        formats = [
            f for f in (group_fmt, NVFP4, FP8) if f in wanted or (f == group_fmt and "groupwise" in wanted)
        ]
        for fmt in formats:
            if not args.no_decode:
                times = bench_decode(name, fmt, n, k, read_gbps, sweep, variants)
                for tokens, us in times.items():
                    key = ("groupwise-int" if fmt in GROUP_FORMATS else fmt, tokens)
                    step[key] = step.get(key, 0.0) + calls * us
            if not args.no_prefill:
                bench_prefill(name, fmt, n, k)
            torch.cuda.empty_cache()
    if args.moe_only or (not args.no_moe and not args.no_decode):
        bench_moe(read_gbps, moe_variants)
    if not args.moe_only and not args.no_moe and not args.no_prefill:
        bench_moe_prefill(prefill_variants)
    for (profile, tokens), us in step.items():
        _emit({"op": "decode step's dense linears (sum of calls x us)", "shape": f"27B {profile} T{tokens}",
               "kernel_us": round(us, 1)})  # fmt: skip


if __name__ == "__main__":
    main()
