"""Quantized weights: the formats of the published `.ninfer` profiles, their exact codecs, and the linear layer
on them. Imports torch (and Triton, where it runs), nothing of ours outside ``kernels``.

Public API (what the model's linear layer builds on):

- ``payload_bytes(fmt, shape)`` -> int: the bytes a quantized object occupies in its layout (the container's
  ``bytes`` member; ``engine/artifact/formats.py`` calls it). ``geometry(fmt, shape)``: each plane's offset,
  size and row bytes.
- ``encode(fmt, w)`` -> uint8 payload (CPU): quantize a float [N, K] weight with the format's encoder (the
  upstream canonical one for Q4/Q5/Q6/W8; ours for NVFP4 and FP8 rows) and pack it exactly as stored. NVFP4's
  weight divisor is inside the payload (its last 4 bytes). ``pack_groupwise`` / ``pack_nvfp4`` / ``pack_fp8``
  pack already chosen words (a pre-quantized checkpoint's), ``decode_words`` recovers them.
- ``decode_ref(fmt, payload, shape)`` -> float32 [N, K]: the represented weight, exact to the bit.
- ``view_planes(fmt, payload, shape, divisor=None, input_divisor=None, repack=False)`` -> ``QuantWeight``: typed
  views of the payload's planes on its device, no copy; ``repack=True`` (row-split formats, the model's layers
  on a GPU) first rewrites the code planes in place into the decode GEMV's layout (``kernels.quant.repack``,
  ``QuantWeight.gemv_layout``); ``QuantWeight.rows(begin, count)`` a row range of a fused parent (no copy);
  ``dequantize(qw)`` -> float32 [N, K] on the weight's device (either layout).
- ``quant_linear(x, qw)`` -> ``x @ W^T`` in x's dtype: the Triton weight-streaming GEMV for at most 8 rows (a
  GEMV-layout weight: ``triton_gemv.py``, tiles ``packed_linear.packed_tiles``), the
  Triton GEMM (FP8: ``torch._scaled_mm`` where the GPU has FP8 tensor cores) above that, on CUDA;
  ``quant_linear_ref(x, qw)`` = ``dequantize`` + matmul in float32 (what the CPU runs).
- ``quant_moe_experts(x, gate_up, down, weights, expert_ids, shared=None, shared_gate=None)``: a MoE layer's
  routed experts on groupwise stacks (gate_up ``[E * 2I, H]``, down ``[E * H, I]``, expert-major: the 35B-A3B
  profile) for few tokens, plus the shared expert's output (gated by ``sigmoid(shared_gate . x)`` when given)
  inside the same launches; ``quant_moe_experts_ref`` = ``kernels.moe.moe_experts_ref`` on the dequantized
  stacks plus that term.
- ``quant_moe_grouped(x, gate_up, down, weights, expert_ids, groups, shared=None)``: the same stacks for many tokens
  (prefill, ``NINFER_MOE_PREFILL=quant``): a grouped GEMM over ``engine.model.mlp``'s expert-sorted rows that
  dequantizes weight tiles in registers; ``quant_moe_grouped_ref`` = the dense path's math on the stacks
  dequantized to x's dtype.

Formats: ``Q4G64_F16S``, ``Q5G64_F16S``, ``Q6G64_F16S``, ``W8G32_F16S`` (``row-split-k128-v1``), ``NVFP4``
(``blockscale-k16-m128x4-v1``), ``FP8_E4M3FN_ROW_BF16S`` (``row-scale-v1``): see ``kernels.quant.formats``.
"""

from __future__ import annotations

from kernels.quant.codec import (
    decode_ref,
    decode_words,
    encode,
    pack_fp8,
    pack_groupwise,
    pack_nvfp4,
    quantize_fp8,
    quantize_groupwise,
    quantize_nvfp4,
)
from kernels.quant.formats import (
    BLOCKSCALE,
    FP8,
    GROUP_FORMATS,
    LAYOUT_OF,
    NVFP4,
    Q4,
    Q5,
    Q6,
    QUANT_FORMATS,
    ROW_SCALE,
    ROW_SPLIT,
    W8,
    Geometry,
    geometry,
    payload_bytes,
)
from kernels.quant.moe_prefill import (
    QuantMoeGroupedTiles,
    quant_moe_grouped,
    quant_moe_grouped_ref,
    quant_moe_grouped_tiles,
)
from kernels.quant.quant_linear import (
    GEMV_MAX_ROWS,
    QuantTiles,
    gemm_tiles,
    gemv_tiles,
    quant_linear,
    quant_linear_ref,
)
from kernels.quant.quant_moe import (
    QUANT_MOE_V2_VARIANTS,
    QuantMoeTiles,
    QuantMoeTilesV2,
    quant_moe_experts,
    quant_moe_experts_ref,
    quant_moe_tiles,
    quant_moe_tiles_v2,
)
from kernels.quant.weight import QuantWeight, dequantize, view_planes

__all__ = [
    "BLOCKSCALE",
    "GEMV_MAX_ROWS",
    "FP8",
    "GROUP_FORMATS",
    "LAYOUT_OF",
    "NVFP4",
    "Q4",
    "Q5",
    "Q6",
    "QUANT_FORMATS",
    "ROW_SCALE",
    "ROW_SPLIT",
    "W8",
    "Geometry",
    "QUANT_MOE_V2_VARIANTS",
    "QuantMoeGroupedTiles",
    "QuantMoeTiles",
    "QuantMoeTilesV2",
    "QuantTiles",
    "QuantWeight",
    "decode_ref",
    "decode_words",
    "dequantize",
    "encode",
    "gemm_tiles",
    "gemv_tiles",
    "geometry",
    "pack_fp8",
    "pack_groupwise",
    "pack_nvfp4",
    "payload_bytes",
    "quantize_fp8",
    "quantize_groupwise",
    "quant_linear",
    "quant_linear_ref",
    "quant_moe_experts",
    "quant_moe_experts_ref",
    "quant_moe_grouped",
    "quant_moe_grouped_ref",
    "quant_moe_grouped_tiles",
    "quant_moe_tiles",
    "quant_moe_tiles_v2",
    "quantize_nvfp4",
    "view_planes",
]
