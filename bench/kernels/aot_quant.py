"""AOT launch values of the quantized linear kernels (kernels/quant/), for bench/kernels/aot_compile.py.

``variants(Variant)`` returns them keyed by kernel name; aot_compile.py passes its ``Variant`` class in (this
file imports nothing of the project, as aot_compile.py runs in the torch-free tools venv). The values are what
``kernels.quant.quant_linear``'s tiles give at the real geometries: Qwen3.6-27B (K = 5120 for the input
projections and MLP gate/up, 6144 for o_proj / GDN out_proj, 17408 for MLP down; Q4/Q5/Q6 groupwise, NVFP4,
FP8 rows for Qwen3.8's mixed profile) and Qwen3.6-35B-A3B (W8 attention/GDN at K = 2048 and its o_proj
[2048, 4096], split 2), bf16 activations.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any


def _mma_group_asm(bits: int) -> str:
    """kernels/quant/mma_asm.py's text for the MMA kernel's ASM (loaded by path: that module imports nothing)."""
    path = Path(__file__).resolve().parents[2] / "kernels" / "quant" / "mma_asm.py"
    spec = importlib.util.spec_from_file_location("ninfer_mma_asm", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.mma_group_asm(bits))


_GROUP_PTRS = {"x_ptr": "bf16", "codes_ptr": "u8", "high_ptr": "u8", "scales_ptr": "fp16"}
# quant_moe_experts' two kernels (v1 and v2 alike): bf16 x and output, fp32 routing weights and act, int64 ids; the
# shared expert's bf16 output and gate score, its fp32 gate (the model's decode: SHARED_GATE / SHARED=2)
_MOE_GATE_UP_PTRS = {
    "x_ptr": "bf16", "codes_ptr": "u8", "high_ptr": "u8", "scales_ptr": "fp16", "ids_ptr": "i64",
    "weights_ptr": "fp32", "act_ptr": "fp32", "score_ptr": "bf16", "gate_ptr": "fp32",
}  # fmt: skip
_MOE_DOWN_PTRS = {
    "act_ptr": "fp32", "codes_ptr": "u8", "high_ptr": "u8", "scales_ptr": "fp16", "ids_ptr": "i64",
    "out_ptr": "bf16", "shared_ptr": "bf16", "gate_ptr": "fp32",
}  # fmt: skip
# quant_moe_grouped's kernel: bf16 x / act / outputs, int32 group ends, int64 row tokens
_MOE_GROUPED_PTRS = {
    "a_ptr": "bf16", "codes_ptr": "u8", "high_ptr": "u8", "scales_ptr": "fp16", "offs_ptr": "i32",
    "token_ptr": "i64", "out_ptr": "bf16",
}  # fmt: skip
_GROUP_ALIGNED = ("x_stride", "codes_stride", "high_stride", "scales_stride")
# (label, format bits, group, K, split): one shape per code path (each BITS; split and unsplit), to keep the
# compile short, with gemv_tiles' split (K is split until the grid has MIN_PROGRAMS = 1024 programs): the
# 27B's Q4 q/k [7168, 5120] (split 5), Q5 down [5120, 17408] (split 17), Q6 head [248320, 5120] (unsplit); the
# 35B-A3B's W8 o_proj [2048, 4096] (split 8). Other K values only change the loop bound.
_GROUP_SHAPES = (
    ("27B Q4 7168x5120 split 5", 4, 64, 5120, 5),
    ("27B Q5 5120x17408 split 17", 5, 64, 17408, 17),
    ("27B Q6 head K=5120", 6, 64, 5120, 1),
    ("35B-A3B W8 2048x4096 split 8", 8, 32, 4096, 8),
)


def variants(variant: Any) -> dict[str, list[Any]]:
    """The launch values of every kernels/quant/ kernel (``variant`` is aot_compile.Variant)."""

    def group_ptrs(bits: int, out: str) -> dict[str, str]:
        return {**_GROUP_PTRS, "codes_ptr": "i8" if bits == 8 else "u8", "out_ptr": out}

    return {
        # gemv_tiles: 32 rows a program, 256 columns a step (4 groups of 64, 8 of 32), 4 warps, 4 stages
        "_quant_gemv_group_kernel": [
            variant(
                label,
                group_ptrs(bits, "fp32" if split > 1 else "bf16"),
                dict(
                    BITS=bits,
                    GROUP=group,
                    GROUPS_SPLIT=k // group // split,
                    GROUPS_STEP=256 // group,
                    BLOCK_N=32,
                    NUM_STAGES=4,
                ),
                aligned=_GROUP_ALIGNED,
                num_stages=4,
            )  # fmt: skip
            for label, bits, group, k, split in _GROUP_SHAPES
        ],
        # the GEMV layout's GEMV (packed_linear.packed_tiles "default": 128 rows a program, one 128-lane unit a
        # step, 4 warps, K split for whole waves on 132 SMs): Q4 q/k [7168, 5120] (40 units, split 8), Q5 down
        # [5120, 17408] (136 units, split 8), Q6 head (unsplit), W8 [2048, 4096] (32 units, split 32); fp16 x;
        # the CUDA-core mode (T = 1)
        "_quant_gemv_packed_kernel": [
            variant(
                label,
                {
                    "x_ptr": x,
                    "codes_ptr": "i32",
                    "high_ptr": {5: "i32", 6: "i16"}.get(bits, "i32"),
                    "scales_ptr": "fp16",
                    "out_ptr": "fp32" if units_split < units else x,
                },
                dict(
                    BITS=bits,
                    UNITS_SPLIT=units_split,
                    STEP_UNITS=1,
                    BLOCK_N=128,
                    MODE=mode,
                    EVEN_K=True,
                    ASM=True,
                ),
                aligned=_GROUP_ALIGNED,
                num_stages=1,
            )  # fmt: skip
            for label, bits, units, units_split, x, mode in (
                ("27B Q4 7168x5120 split 8", 4, 40, 5, "bf16", 0),
                ("27B Q5 5120x17408 split 8", 5, 136, 17, "bf16", 0),
                ("27B Q6 head K=5120", 6, 40, 40, "bf16", 0),
                ("35B-A3B W8 2048x4096 split 32", 8, 32, 1, "bf16", 0),
                ("Q4 fp16 x", 4, 40, 5, "fp16", 0),
                ("Q5 CUDA cores T=1", 5, 136, 8, "bf16", 1),
            )
        ],
        # the Gluon one-row GEMV (packed_linear "pairs" tiles, 4 warps), x as int32 lane pairs
        "_quant_gemv_pairs_kernel": [
            variant(
                label,
                {
                    "xw_ptr": "i32",
                    "codes_ptr": "i32",
                    "high_ptr": {5: "u8", 6: "i16"}.get(bits, "i32"),
                    "scales_ptr": "fp16",
                    "out_ptr": "fp32" if units_split < units else "bf16",
                },
                dict(BITS=bits, UNITS_SPLIT=units_split, BLOCK_N=block_n, NUM_WARPS=4, STEP=step),
                aligned=("codes_stride", "high_stride", "scales_stride"),
            )  # fmt: skip
            for label, bits, units, units_split, block_n, step in (
                ("27B Q4 7168x5120 split 8", 4, 40, 5, 128, 1),
                ("27B Q5 5120x17408 split 8, two units a step", 5, 136, 34, 64, 2),
                ("27B Q6 head K=5120", 6, 40, 40, 32, 1),
            )
        ],
        # the cp.async ring one-row GEMV (packed_linear "ring" tiles): the pairs kernel's arithmetic, its weight bytes
        # through STAGES shared-memory slots; scales as int32 words (a unit's two fp16 scales)
        "_quant_gemv_ring_kernel": [
            variant(
                label,
                {
                    "xw_ptr": "i32",
                    "codes_ptr": "i32",
                    "high_ptr": {5: "u8", 6: "i16"}.get(bits, "i32"),
                    "scales_ptr": "i32",
                    "out_ptr": "fp32" if units_split < units else "bf16",
                    "final_ptr": "bf16",
                    "count_ptr": "i32",
                },
                dict(
                    BITS=bits,
                    UNITS_SPLIT=units_split,
                    BLOCK_N=block_n,
                    NUM_WARPS=warps,
                    STEP=step,
                    STAGES=stages,
                    LAST=last,
                ),
                aligned=("codes_stride", "high_stride"),
                num_warps=warps,
            )  # fmt: skip
            for label, bits, units, units_split, block_n, step, stages, warps, last in (
                ("27B Q4 7168x5120 split 5, ring_n64s2", 4, 40, 8, 64, 2, 4, 4, False),
                ("27B Q4 7168x5120 split 5, ring_n64s2, the last split reduces", 4, 40, 8, 64, 2, 4, 4, True),
                ("27B Q5 5120x17408 split 4, ring_n64s2", 5, 136, 34, 64, 2, 4, 4, False),
                ("27B Q6 head K=5120, ring_n64s2", 6, 40, 40, 64, 2, 4, 4, False),
                ("27B Q5 5120x6144 split 6, ring_n64s2st3", 5, 48, 8, 64, 2, 3, 4, False),
                ("27B Q6 head K=5120, ring_n64s1", 6, 40, 40, 64, 1, 4, 4, False),
                ("27B Q4 34816x5120 split 2, ring_n32w2s2", 4, 40, 20, 32, 2, 4, 2, False),
                ("27B Q4 4096x5120 split 10, ring_n128s1", 4, 40, 4, 128, 1, 4, 4, False),
                ("one unit a program (empty copy groups)", 4, 40, 1, 64, 1, 4, 4, False),
            )
        ],
        # the tensor-core GEMV (1..8 rows of x) through the same cp.async ring (packed_linear "mmaring_*" tiles)
        "_quant_gemv_mma_ring_kernel": [
            variant(
                label,
                {
                    "xw_ptr": "i32",
                    "codes_ptr": "i32",
                    "high_ptr": {5: "u8", 6: "i16"}.get(bits, "i32"),
                    "scales_ptr": "i32",
                    "out_ptr": "fp32" if units_split < units else "bf16",
                    "final_ptr": "bf16",
                    "count_ptr": "i32",
                },
                dict(
                    T=t,
                    BITS=bits,
                    UNITS_SPLIT=units_split,
                    BLOCK_N=block_n,
                    NUM_WARPS=warps,
                    STEP=step,
                    STAGES=stages,
                    ASM=_mma_group_asm(bits),
                    LAST=last,
                ),
                aligned=("xw_stride", "codes_stride", "high_stride"),
                num_warps=warps,
            )  # fmt: skip
            for label, t, bits, units, units_split, block_n, step, stages, warps, last in (
                ("27B Q4 7168x5120 T=8 split 5, mmaring_n64s2", 8, 4, 40, 8, 64, 2, 4, 4, False),
                (
                    "27B Q4 7168x5120 T=8 split 5, mmaring_n64s2, the last split reduces",
                    8,
                    4,
                    40,
                    8,
                    64,
                    2,
                    4,
                    4,
                    True,
                ),
                ("27B Q5 5120x17408 T=4 split 4, mmaring_n64s2", 4, 5, 136, 34, 64, 2, 4, 4, False),
                ("27B Q6 head K=5120 T=4, mmaring_n128s1", 4, 6, 40, 40, 128, 1, 4, 4, False),
                ("27B Q4 34816x5120 T=8 split 2, mmaring_n32w2s2", 8, 4, 40, 20, 32, 2, 4, 2, False),
            )
        ],
        # W8's one-row GEMV through the cp.async ring (packed_linear "ring_*" tiles for W8)
        "_quant_gemv_w8_ring_kernel": [
            variant(
                label,
                {
                    "x_ptr": "bf16",
                    "codes_ptr": "i32",
                    "scales_ptr": "i32",
                    "out_ptr": out,
                    "final_ptr": "bf16",
                    "count_ptr": "i32",
                },
                dict(
                    UNITS_SPLIT=units_split, BLOCK_N=block_n, NUM_WARPS=4, STEP=step, STAGES=stages, LAST=last
                ),
                aligned=("codes_stride",),
            )  # fmt: skip
            for label, units_split, out, block_n, step, stages, last in (
                ("35B-A3B W8 GDN in_proj K=2048, ring_n32s2", 16, "bf16", 32, 2, 4, False),
                (
                    "35B-A3B W8 GDN in_proj K=2048, ring_n32s2, the last split reduces",
                    16,
                    "bf16",
                    32,
                    2,
                    4,
                    True,
                ),
                ("35B-A3B W8 o_proj 2048x4096 split 4, ring_n32s2", 8, "fp32", 32, 2, 4, False),
                ("W8 one pass, ring_n64s1", 2, "fp32", 64, 1, 4, False),
            )
        ],
        # the tensor-core one-row GEMV on the same loads (packed_linear "mma" tiles: 64 or 128 rows, 4 warps)
        "_quant_gemv_mma_kernel": [
            variant(
                label,
                {
                    "xw_ptr": "i32",
                    "codes_ptr": "i32",
                    "high_ptr": {5: "u8", 6: "i16"}.get(bits, "i32"),
                    "scales_ptr": "fp16",
                    "out_ptr": "fp32" if units_split < units else "bf16",
                },
                dict(
                    T=rows,
                    BITS=bits,
                    UNITS_SPLIT=units_split,
                    BLOCK_N=block_n,
                    NUM_WARPS=4,
                    STEP=step,
                    ASM=_mma_group_asm(bits),
                ),
                aligned=("xw_stride", "codes_stride", "high_stride", "scales_stride"),
            )  # fmt: skip
            for label, rows, bits, units, units_split, block_n, step in (
                ("27B Q4 34816x5120 split 5, one row", 1, 4, 40, 8, 64, 1),
                ("27B Q5 5120x17408 split 8, 8 rows", 8, 5, 136, 17, 64, 1),
                ("27B Q6 head K=5120, 4 rows", 4, 6, 40, 40, 128, 2),
            )
        ],
        # FP8 rows' Gluon one-row GEMV (quant_linear.one_row_tiles: 64 rows a program, 4 warps, 64-lane steps)
        "_quant_gemv_fp8_rows_kernel": [
            variant(
                label,
                {"xw_ptr": "i32", "codes_ptr": "i32", "scales_ptr": "bf16", "out_ptr": out},
                dict(STEPS_SPLIT=steps, BLOCK_N=64, NUM_WARPS=4),
                aligned=("codes_stride",),
            )  # fmt: skip
            for label, steps, out in (
                ("Qwen3.8 FP8 5120x6144 split 12", 8, "fp32"),
                ("FP8 head K=5120", 80, "bf16"),
            )
        ],
        # W8's Gluon one-row GEMV on the GEMV layout (packed_linear "pairs" tiles: 32 rows a program, 4 warps)
        "_quant_gemv_w8_pairs_kernel": [
            variant(
                "35B-A3B W8 2048x4096 split 8",
                {"x_ptr": "bf16", "codes_ptr": "i32", "scales_ptr": "fp16", "out_ptr": "fp32"},
                dict(UNITS_SPLIT=4, BLOCK_N=32, NUM_WARPS=4),
                aligned=("codes_stride", "scales_stride"),
            )
        ],
        # NVFP4's Gluon one-row GEMV (quant_linear.one_row_tiles: 64 rows a program, 4 warps, 128-lane steps)
        "_quant_gemv_nvfp4_rows_kernel": [
            variant(
                label,
                {"xw_ptr": "i32", "codes_ptr": "i32", "scales_ptr": "u8", "out_ptr": out},
                dict(STEPS_SPLIT=steps, BLOCK_N=64, NUM_WARPS=4),
                aligned=("codes_stride", "tile_stride"),
                floats=("out_scale",),
            )  # fmt: skip
            for label, steps, out in (
                ("27B NVFP4 34816x5120 split 2", 20, "fp32"),
                ("NVFP4 K=5120", 40, "bf16"),
            )
        ],
        # NVFP4's one-row GEMV through the cp.async ring (quant_linear "rows_ring" tiles)
        "_quant_gemv_nvfp4_ring_kernel": [
            variant(
                label,
                {
                    "xw_ptr": "i32",
                    "codes_ptr": "i32",
                    "scales_ptr": "u8",
                    "out_ptr": out,
                    "final_ptr": "bf16",
                    "count_ptr": "i32",
                },
                dict(STEPS_SPLIT=steps, BLOCK_N=64, NUM_WARPS=4, STEP=step, STAGES=stages, LAST=last),
                aligned=("codes_stride", "tile_stride"),
                floats=("out_scale",),
            )  # fmt: skip
            for label, steps, out, step, stages, last in (
                ("27B NVFP4 34816x5120 split 2, 2 steps x 4 slots", 20, "fp32", 2, 4, False),
                (
                    "27B NVFP4 34816x5120 split 2, 2 steps x 4 slots, the last split reduces",
                    20,
                    "fp32",
                    2,
                    4,
                    True,
                ),
                ("NVFP4 K=5120, 1 step x 4 slots", 40, "bf16", 1, 4, False),
                ("NVFP4 K=5120 split 10, one pass", 4, "fp32", 1, 4, False),
            )
        ],
        # FP8 rows' one-row GEMV through the cp.async ring (quant_linear "rows_ring" tiles)
        "_quant_gemv_fp8_ring_kernel": [
            variant(
                label,
                {
                    "xw_ptr": "i32",
                    "codes_ptr": "i32",
                    "scales_ptr": "bf16",
                    "out_ptr": out,
                    "final_ptr": "bf16",
                    "count_ptr": "i32",
                },
                dict(STEPS_SPLIT=steps, BLOCK_N=64, NUM_WARPS=4, STEP=step, STAGES=stages, LAST=last),
                aligned=("codes_stride",),
            )  # fmt: skip
            for label, steps, out, step, stages, last in (
                ("Qwen3.8 FP8 attention 7168x5120 split 4, 2 steps x 4 slots", 20, "fp32", 2, 4, False),
                (
                    "Qwen3.8 FP8 attention 7168x5120 split 4, 2 steps x 4 slots, the last split reduces",
                    20,
                    "fp32",
                    2,
                    4,
                    True,
                ),
                ("FP8 K=5120, 1 step x 4 slots", 80, "bf16", 1, 4, False),
            )
        ],
        "_quant_dequant_packed_kernel": [
            variant(
                f"Q{bits}" if bits < 8 else "W8",
                {
                    "codes_ptr": "i32",
                    "high_ptr": {5: "i32", 6: "i16"}.get(bits, "i32"),
                    "scales_ptr": "fp16",
                    "out_ptr": "bf16",
                },
                dict(BITS=bits, BLOCK_N=32),
                aligned=(*_GROUP_ALIGNED[1:], "out_stride"),
            )  # fmt: skip
            for bits in (4, 5, 6, 8)
        ],
        # gemm_tiles at 7,680 rows: 128 weight rows x 128 rows of x, K steps of 64, 8 warps, 3 stages
        "_quant_gemm_group_kernel": [
            variant(
                label,
                group_ptrs(bits, "bf16"),
                dict(BITS=bits, GROUP=group, K_PAD=k, BLOCK_N=128, BLOCK_T=128, BLOCK_K=64, NUM_STAGES=3),
                aligned=_GROUP_ALIGNED,
                num_warps=8,
            )
            for label, bits, group, k in (
                ("27B Q4 K=5120", 4, 64, 5120),
                ("27B Q5 K=17408", 5, 64, 17408),
                ("35B-A3B W8 K=2048", 8, 32, 2048),
            )
        ],
        # NVFP4 (27B nvfp4 and Qwen3.8's MLP): 32 rows, 256 columns a step; the 128x4 scale tiles' row stride;
        # MLP down [5120, 17408] split in 17
        "_quant_gemv_nvfp4_kernel": [
            variant(
                f"K={k} split 17",
                dict(x_ptr="bf16", codes_ptr="u8", scales_ptr="u8", out_ptr="fp32"),
                dict(K_SPLIT=k // 17, BLOCK_N=32, BLOCK_K=256, NUM_STAGES=4),
                floats=("divisor",),
                aligned=("x_stride", "codes_stride", "tile_stride"),
                num_stages=4,
            )
            for k in (17408,)
        ],
        "_quant_gemm_nvfp4_kernel": [
            variant(
                f"K={k}",
                dict(x_ptr="bf16", codes_ptr="u8", scales_ptr="u8", out_ptr="bf16"),
                dict(K=k, BLOCK_N=128, BLOCK_T=128, BLOCK_K=128, NUM_STAGES=3),
                floats=("divisor",),
                aligned=("x_stride", "codes_stride", "tile_stride"),
                num_warps=8,
            )
            for k in (5120,)
        ],
        # FP8 rows (Qwen3.8 mixed: embedding/head, attention/GDN projections, late MLP): 512 columns a step;
        # MLP down [5120, 17408] split in 17
        "_quant_gemv_fp8_kernel": [
            variant(
                f"K={k} split 17",
                dict(x_ptr="bf16", codes_ptr="u8", scales_ptr="bf16", out_ptr="fp32"),
                dict(K_SPLIT=k // 17, BLOCK_N=32, BLOCK_K=512, NUM_STAGES=4),
                aligned=("x_stride", "codes_stride"),
                num_stages=4,
            )
            for k in (17408,)
        ],
        "_quant_gemm_fp8_kernel": [
            variant(
                f"K={k} (A16; sm_89+ takes torch._scaled_mm)",
                dict(x_ptr="bf16", codes_ptr="u8", scales_ptr="bf16", out_ptr="bf16"),
                dict(K=k, BLOCK_N=128, BLOCK_T=128, BLOCK_K=128, NUM_STAGES=3),
                aligned=("x_stride", "codes_stride"),
                num_warps=8,
            )
            for k in (6144,)
        ],
        # quant_moe_experts at the 35B-A3B geometry: E 256, H 2048, I 512, top_k 8; gate_up Q4 (K 2048: 32
        # groups), down Q5 and Q6 (K 512: 8 groups); quant_moe_tiles: BLOCK_N 32, BLOCK_H 16, 4 warps
        "_quant_moe_gate_up_kernel": [
            variant(
                "35B-A3B gate_up Q4",
                _MOE_GATE_UP_PTRS,
                dict(
                    HIDDEN=2048,
                    INTER=512,
                    TOP_K=8,
                    BITS=4,
                    GROUP=64,
                    GROUPS=32,
                    BLOCK_N=32,
                    NUM_STAGES=3,
                    SHARED_GATE=True,
                ),
                aligned=("x_stride", "codes_stride", "high_stride", "scales_stride"),
            )  # fmt: skip
        ],
        "_quant_moe_down_kernel": [
            variant(
                f"35B-A3B down Q{bits}",
                _MOE_DOWN_PTRS,
                dict(HIDDEN=2048, INTER=512, TOP_K=8, BITS=bits, GROUP=64, GROUPS=8, BLOCK_H=16, SHARED=2),
                aligned=("codes_stride", "high_stride", "shared_stride"),
            )  # fmt: skip
            for bits in (5,)
        ],
        # NINFER_MOE_PREFILL=quant (kernels/quant/triton_moe_grouped.py) at the 35B-A3B (E 256, H 2048, I 512), bf16;
        # quant_moe_grouped_tiles: BLOCK_M 16 (T = 128), 32 (T = 1024), 128 (T = 7680); gate_up 64 gate + 64 up rows
        # a program, down 128 output rows, K steps of 64, 8 warps, 3 stages
        "_quant_moe_grouped_kernel": [
            variant(
                f"35B-A3B {'gate_up' if gate_up else 'down'} Q{bits} M{block_m}",
                _MOE_GROUPED_PTRS,
                dict(
                    N=512 if gate_up else 2048,
                    K=2048 if gate_up else 512,
                    K_PAD=2048 if gate_up else 512,
                    NUM_EXPERTS=256,
                    BITS=bits,
                    GROUP=64,
                    GATE_UP=gate_up,
                    BLOCK_E=256,
                    BLOCK_M=block_m,
                    BLOCK_N=64 if gate_up else 128,
                    BLOCK_K=64,
                    NUM_STAGES=3,
                ),
                aligned=("a_stride", "codes_stride", "high_stride", *(("scales_stride",) if gate_up else ())),
                num_warps=8,
            )  # fmt: skip
            for gate_up, bits, block_m in (
                (True, 4, 16),
                (True, 4, 32),
                (True, 4, 128),
                (False, 5, 16),
                (False, 5, 128),
                (False, 6, 128),
            )  # fmt: skip
        ],
        # NINFER_QUANT_MOE=v2 (kernels/quant/triton_moe.py) at the same geometry; quant_moe_tiles_v2's defaults:
        # gate_up 8 row pairs a program, chunks of 512 lanes (K_pad 2048: 4), 4 warps; down 8 rows a program, top_k 8 at
        # once, chunks of 256 lanes (K_pad 512: 2), 8 warps
        "_quant_moe_gate_up_v2_kernel": [
            variant(
                f"35B-A3B gate_up Q{bits}",
                _MOE_GATE_UP_PTRS,
                dict(
                    HIDDEN=2048,
                    INTER=512,
                    ACT_STRIDE=512,
                    TOP_K=8,
                    BITS=bits,
                    GROUP=64,
                    K_PAD=2048,
                    BLOCK_N=8,
                    BLOCK_K=512,
                    X_PAIRS=True,
                    SHARED_GATE=True,
                ),
                aligned=("x_stride", "codes_stride", "high_stride", "scales_stride"),
            )
            for bits in (4, 6)
        ],
        "_quant_moe_down_v2_kernel": [
            variant(
                f"35B-A3B down Q{bits}",
                _MOE_DOWN_PTRS,
                dict(
                    HIDDEN=2048,
                    INTER=512,
                    ACT_STRIDE=512,
                    TOP_K=8,
                    BLOCK_TOPK=8,
                    BITS=bits,
                    GROUP=64,
                    K_PAD=512,
                    BLOCK_H=8,
                    BLOCK_K=256,
                    SHARED=2,
                ),
                aligned=("codes_stride", "high_stride", "shared_stride"),
                num_warps=8,
            )
            for bits in (5, 6)
        ],  # fmt: skip
        # dequantize_to (the "dequant" prefill route): 32 rows x 128 columns a program (NVFP4: 64), 4 warps
        "_quant_dequant_group_kernel": [
            variant(
                f"Q{bits}" if bits < 8 else "W8",
                {p: t for p, t in group_ptrs(bits, "bf16").items() if p != "x_ptr"},
                dict(BITS=bits, GROUP=group, BLOCK_N=32, BLOCK_K=128),
                aligned=(*_GROUP_ALIGNED[1:], "out_stride"),
            )
            for label, bits, group, k, split in _GROUP_SHAPES
            if bits != 4
        ],
        "_quant_dequant_fp_kernel": [
            variant(
                "NVFP4" if nvfp4 else "FP8 rows",
                dict(codes_ptr="u8", scales_ptr="u8" if nvfp4 else "bf16", out_ptr="bf16"),
                dict(NVFP4=nvfp4, BLOCK_N=32, BLOCK_K=64 if nvfp4 else 128),
                floats=("divisor",),
                aligned=("codes_stride", "tile_stride", "out_stride")
                if nvfp4
                else ("codes_stride", "out_stride"),
            )
            for nvfp4 in (True, False)
        ],
    }
