"""Tensor formats and layouts of the `.ninfer` container: names, alignment and encoded sizes.

This module owns the closed registries of formats and layouts and the function that says how many bytes a
tensor of a given shape, format and layout occupies (the quantized layouts' rule is
``kernels.quant.formats.payload_bytes``, the one copy of it). The container reader refuses any object whose
`bytes` member disagrees with it.

Layouts:
- `contiguous-le-v1`: plain little-endian row-major elements (BF16, FP16, FP32, I32); rank 0..16.
- `row-split-k128-v1`: groupwise-quantised rank-2 matrices `[N, K]`; K is padded to a multiple of 128 and
  the payload is three planes, each starting 256-byte aligned: the base codes (4 bits per weight for
  Q4/Q5/Q6 with the even lane in the low nibble, 8 bits for W8), an optional high-bit plane (Q5: 1 bit,
  Q6: 2 bits per weight) and the FP16 scales, one per group, all in row-major group order.
  Example: Q5 `[2, 130]` -> K_pad 256, 8 groups: codes 256 B, high bits 64 B (padded to 256), scales 16 B
  = 528 B.
- `blockscale-k16-m128x4-v1`: NVFP4 rank-2 matrices `[N, K]` with N a multiple of 128 and K of 64: the FP4
  (E2M1) codes, two per byte (N * K / 2 bytes, padded to 256), then one FP8 (E4M3) scale per 16 weights along K
  swizzled in 128-row x 4-column tiles (N * K / 16 bytes), then the FP32 per-tensor weight divisor (4 bytes).
  Example: `[128, 64]` -> 4096 + 512 + 4 = 4,612 B.
- `row-scale-v1`: `FP8_E4M3FN_ROW_BF16S` rank-2 matrices: E4M3 codes, one byte each (N * K, padded to 256),
  then one BF16 scale per output row. Example: `[128, 64]` -> 8192 + 256 = 8,448 B.

The published artifacts' sizes check these rules end to end: `ninfer-artifact plan` reproduces every
published file's byte size from them (tests/artifact/test_profiles.py).
"""

from __future__ import annotations

import torch

from kernels.quant import formats as quant_formats

PAGE_ALIGN = 4096  # payload offset alignment
TENSOR_ALIGN = 256  # tensor object alignment inside the payload
RESOURCE_ALIGN = 1  # raw resources are byte-aligned

CONTIGUOUS = "contiguous-le-v1"
ROW_SPLIT = "row-split-k128-v1"
BLOCKSCALE = "blockscale-k16-m128x4-v1"
ROW_SCALE = "row-scale-v1"
RAW_BYTES = "raw-bytes-v1"


PLAIN_FORMATS: dict[str, torch.dtype] = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "FP32": torch.float32,
    "I32": torch.int32,
}
NVFP4 = quant_formats.NVFP4
FP8_ROW = quant_formats.FP8
FORMATS: frozenset[str] = frozenset(PLAIN_FORMATS) | quant_formats.QUANT_FORMATS
LAYOUTS: frozenset[str] = frozenset({CONTIGUOUS, ROW_SPLIT, BLOCKSCALE, ROW_SCALE})
# the one layout each format is stored in
LAYOUT_OF: dict[str, str] = {**{name: CONTIGUOUS for name in PLAIN_FORMATS}, **quant_formats.LAYOUT_OF}
FORMAT_FOR_DTYPE: dict[torch.dtype, str] = {dtype: name for name, dtype in PLAIN_FORMATS.items()}


def align_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


def _numel(shape: list[int]) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n


def tensor_alignment(layout: str) -> int:
    return TENSOR_ALIGN


def encoded_bytes(shape: list[int], fmt: str, layout: str) -> int:
    """Bytes a tensor of `shape` in `fmt`/`layout` occupies; ValueError for a combination we do not know."""
    if layout == CONTIGUOUS:
        if fmt not in PLAIN_FORMATS:
            raise ValueError(f"format {fmt!r} cannot use layout {CONTIGUOUS!r}")
        if len(shape) > 16:
            raise ValueError(f"layout {CONTIGUOUS!r} allows rank 0..16, got rank {len(shape)}")
        return _numel(shape) * PLAIN_FORMATS[fmt].itemsize
    if layout in (ROW_SPLIT, BLOCKSCALE, ROW_SCALE):
        if LAYOUT_OF.get(fmt) != layout:
            raise ValueError(f"format {fmt!r} cannot use layout {layout!r}")
        return quant_formats.payload_bytes(fmt, shape)  # the one size rule of the quantized layouts
    raise ValueError(f"unknown layout {layout!r}")
