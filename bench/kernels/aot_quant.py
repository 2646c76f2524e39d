"""AOT launch values of the quantized linear kernels (kernels/quant/), for bench/kernels/aot_compile.py.

``variants(Variant)`` returns them keyed by kernel name; aot_compile.py passes its ``Variant`` class in (this
file imports nothing of the project, as aot_compile.py runs in the torch-free tools venv). The values are what
``kernels.quant.quant_linear``'s tiles give at the real geometries: Qwen3.6-27B (K = 5120 for the input
projections and MLP gate/up, 6144 for o_proj / GDN out_proj, 17408 for MLP down; Q4/Q5/Q6 groupwise, NVFP4,
FP8 rows for Qwen3.8's mixed profile) and Qwen3.6-35B-A3B (W8 attention/GDN at K = 2048 and its o_proj
[2048, 4096], split 2), bf16 activations.
"""

from __future__ import annotations

from typing import Any

_GROUP_PTRS = {"x_ptr": "bf16", "codes_ptr": "u8", "high_ptr": "u8", "scales_ptr": "fp16"}
_GROUP_ALIGNED = ("x_stride", "codes_stride", "high_stride", "scales_stride")
# (label, format bits, group, K, split): the 27B's Q4 q/k & gate_up (K 5120), Q5 o_proj (6144) and down
# (17408), Q6 head (5120); the 35B-A3B's W8 (K 2048, and its o_proj 4096 split in 2)
_GROUP_SHAPES = (
    ("27B Q4 K=5120", 4, 64, 5120, 1),
    ("27B Q5 K=6144", 5, 64, 6144, 1),
    ("27B Q5 K=17408", 5, 64, 17408, 1),
    ("27B Q6 K=5120", 6, 64, 5120, 1),
    ("35B-A3B W8 K=2048", 8, 32, 2048, 1),
    ("35B-A3B W8 2048x4096 split 2", 8, 32, 4096, 2),
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
        # gemm_tiles at 7,680 rows: 128 weight rows x 128 rows of x, K steps of 64, 8 warps, 3 stages
        "_quant_gemm_group_kernel": [
            variant(
                label,
                group_ptrs(bits, "bf16"),
                dict(BITS=bits, GROUP=group, K_PAD=k, BLOCK_N=128, BLOCK_T=128, BLOCK_K=64, NUM_STAGES=3),
                aligned=_GROUP_ALIGNED,
                num_warps=8,
            )
            for label, bits, group, k, split in _GROUP_SHAPES
            if split == 1
        ],
        # NVFP4 (27B nvfp4 and Qwen3.8's MLP): 32 rows, 256 columns a step; the 128x4 scale tiles' row stride
        "_quant_gemv_nvfp4_kernel": [
            variant(
                f"K={k}",
                dict(x_ptr="bf16", codes_ptr="u8", scales_ptr="u8", out_ptr="bf16"),
                dict(K_SPLIT=k, BLOCK_N=32, BLOCK_K=256, NUM_STAGES=4),
                floats=("divisor",),
                aligned=("x_stride", "codes_stride", "tile_stride"),
                num_stages=4,
            )
            for k in (5120, 17408)
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
            for k in (5120, 17408)
        ],
        # FP8 rows (Qwen3.8 mixed: embedding/head, attention/GDN projections, late MLP): 512 columns a step
        "_quant_gemv_fp8_kernel": [
            variant(
                f"K={k}",
                dict(x_ptr="bf16", codes_ptr="u8", scales_ptr="bf16", out_ptr="bf16"),
                dict(K_SPLIT=k, BLOCK_N=32, BLOCK_K=512, NUM_STAGES=4),
                aligned=("x_stride", "codes_stride"),
                num_stages=4,
            )
            for k in (5120, 6144, 17408)
        ],
        "_quant_gemm_fp8_kernel": [
            variant(
                f"K={k} (A16; sm_89+ takes torch._scaled_mm)",
                dict(x_ptr="bf16", codes_ptr="u8", scales_ptr="bf16", out_ptr="bf16"),
                dict(K=k, BLOCK_N=128, BLOCK_T=128, BLOCK_K=128, NUM_STAGES=3),
                aligned=("x_stride", "codes_stride"),
                num_warps=8,
            )
            for k in (5120, 6144, 17408)
        ],
    }
