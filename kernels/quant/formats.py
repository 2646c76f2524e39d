"""The quantized weight formats of the `.ninfer` container and their payload geometry (plane offsets, sizes).

This module owns the one formula for how many bytes a quantized tensor occupies (``payload_bytes``) and where
each plane of its payload starts (``geometry``). ``engine/artifact/formats.py`` calls ``payload_bytes`` for the
quantized layouts; nothing else restates these rules.

Formats, each with exactly one layout (the upstream NInfer storage-layout contract, in our words):

- ``Q4G64_F16S`` / ``Q5G64_F16S`` / ``Q6G64_F16S`` / ``W8G32_F16S`` in ``row-split-k128-v1``: signed codes
  of 4/5/6/8 bits, one binary16 scale per group of 64 (32 for W8) along K; K padded to ``K_pad =
  align_up(K, 128)``. Three planes in row-major group order, each starting 256-byte aligned: the base plane
  (4-bit words two a byte, the even lane in the low nibble; W8: one two's-complement byte a lane), the high
  plane (Q5: bit 4 of each lane, Q6: bits 4 and 5, as a lane-major bit stream, stream bit t in bit t % 8 of
  byte t // 8), then the little-endian binary16 scales. Lanes past K have code 0; groups wholly past K have
  scale 0. ``payload = align_up(base, 256) + align_up(high, 256) + 2 * N * K_pad / G``.
- ``NVFP4`` in ``blockscale-k16-m128x4-v1`` (N a multiple of 128, K of 64): E2M1 codes two a byte (the lower K
  in the low nibble), row-major ``[N, K/2]``; at the next 256-byte boundary one E4M3FN scale per 16 weights,
  swizzled in tiles of 128 rows x 4 scale columns (512 bytes a tile, tiles in row-tile-major order: the
  tensor-core scale layout); then the little-endian FP32 weight divisor ``d_w``, the last 4 bytes of the
  payload. ``W[n, k] = e2m1(code) * e4m3(scale[n, k // 16]) / d_w``. An NVFP4 execution path that quantizes
  its input (W4A4) takes a separate per-site FP32 input divisor; it is a tensor object of its own in the
  artifact (FP32, shape [], contiguous-le-v1), not part of this payload.
- ``FP8_E4M3FN_ROW_BF16S`` in ``row-scale-v1``: ``N * K`` E4M3FN code bytes row-major, then at the next
  256-byte boundary one little-endian BF16 multiplier per row. ``W[n, k] = e4m3(code) * scale[n]``.

Published checks (tests/kernels/test_quant_codec.py): NVFP4 [128, 64] is 4,612 bytes, Q4 [128, 128] 8,704,
FP8 [128, 64] 8,448, Q5 [2, 130] 528.
"""

from __future__ import annotations

from dataclasses import dataclass

PLANE_ALIGN = 256  # every plane of a quantized payload starts at a multiple of this (payload-relative)

ROW_SPLIT = "row-split-k128-v1"
BLOCKSCALE = "blockscale-k16-m128x4-v1"
ROW_SCALE = "row-scale-v1"

Q4 = "Q4G64_F16S"
Q5 = "Q5G64_F16S"
Q6 = "Q6G64_F16S"
W8 = "W8G32_F16S"
NVFP4 = "NVFP4"
FP8 = "FP8_E4M3FN_ROW_BF16S"


@dataclass(frozen=True, slots=True)
class GroupFormat:
    """A groupwise signed-integer format: ``bits`` per code, one binary16 scale per ``group_size`` weights."""

    bits: int
    group_size: int
    qmax: int  # the reference encoder's scale denominator (codes are clamped to [qmin, qmax])
    qmin: int


GROUP_FORMATS: dict[str, GroupFormat] = {
    Q4: GroupFormat(4, 64, 7, -8),
    Q5: GroupFormat(5, 64, 15, -16),
    Q6: GroupFormat(6, 64, 31, -32),
    W8: GroupFormat(8, 32, 127, -127),  # W8 never uses -128
}
LAYOUT_OF: dict[str, str] = {**{name: ROW_SPLIT for name in GROUP_FORMATS}, NVFP4: BLOCKSCALE, FP8: ROW_SCALE}
QUANT_FORMATS: frozenset[str] = frozenset(LAYOUT_OF)
NVFP4_BLOCK = 16  # weights per E4M3 scale
K_ALIGN = 128  # row-split pads K to this


def align_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


@dataclass(frozen=True, slots=True)
class Geometry:
    """Where each plane of a payload lies (byte offsets and sizes from the payload's start).

    row_bytes are the bytes one row takes in each plane (a row view of rows [a, b) is each plane's
    ``[offset + a * row_bytes, offset + b * row_bytes)``; for NVFP4 the scale plane is addressed in whole
    128-row tiles). k_pad is the physical row length in weights (K itself for NVFP4 and FP8).
    """

    format: str
    n: int
    k: int
    k_pad: int
    codes_offset: int
    codes_bytes: int
    codes_row_bytes: int
    high_offset: int
    high_bytes: int
    high_row_bytes: int
    scales_offset: int
    scales_bytes: int
    scales_row_bytes: int  # 0 for NVFP4 (swizzled: 512 bytes a 128-row tile and 64 columns)
    divisor_offset: int  # NVFP4 only: the FP32 weight divisor; -1 otherwise
    payload_bytes: int

    @property
    def groups_per_row(self) -> int:
        """Scale words a row (row-split: physical groups; NVFP4: K / 16; FP8: 1)."""
        if self.format in GROUP_FORMATS:
            return self.k_pad // GROUP_FORMATS[self.format].group_size
        return self.k // NVFP4_BLOCK if self.format == NVFP4 else 1


def _shape(fmt: str, shape: tuple[int, ...] | list[int]) -> tuple[int, int]:
    if fmt not in QUANT_FORMATS:
        raise ValueError(f"unknown quantized format {fmt!r} (known: {sorted(QUANT_FORMATS)})")
    if len(shape) != 2 or any(int(d) <= 0 for d in shape):
        raise ValueError(f"{fmt} ({LAYOUT_OF[fmt]}) needs a positive rank-2 shape [N, K], got {list(shape)}")
    n, k = int(shape[0]), int(shape[1])
    if fmt == NVFP4 and (n % 128 or k % 64):
        raise ValueError(f"{NVFP4} ({BLOCKSCALE}) needs N a multiple of 128 and K of 64, got [{n}, {k}]")
    return n, k


def geometry(fmt: str, shape: tuple[int, ...] | list[int]) -> Geometry:
    """The plane layout of a ``fmt`` tensor of logical ``shape`` [N, K]; ValueError for a shape it cannot take."""
    n, k = _shape(fmt, shape)
    if fmt in GROUP_FORMATS:
        spec = GROUP_FORMATS[fmt]
        k_pad = align_up(k, K_ALIGN)
        groups = k_pad // spec.group_size
        codes_row = k_pad if spec.bits == 8 else k_pad // 2
        high_row = k_pad * (spec.bits - 4) // 8 if spec.bits in (5, 6) else 0
        high_offset = align_up(n * codes_row, PLANE_ALIGN)
        scales_offset = high_offset + align_up(n * high_row, PLANE_ALIGN)
        return Geometry(
            fmt, n, k, k_pad, 0, n * codes_row, codes_row, high_offset, n * high_row, high_row,
            scales_offset, n * groups * 2, groups * 2, -1, scales_offset + n * groups * 2,
        )  # fmt: skip
    if fmt == NVFP4:
        scales_offset = align_up(n * k // 2, PLANE_ALIGN)
        scales_bytes = n * k // NVFP4_BLOCK
        divisor = scales_offset + scales_bytes
        return Geometry(
            fmt, n, k, k, 0, n * k // 2, k // 2, scales_offset, 0, 0,
            scales_offset, scales_bytes, 0, divisor, divisor + 4,
        )  # fmt: skip
    scales_offset = align_up(n * k, PLANE_ALIGN)  # FP8 rows
    return Geometry(
        fmt, n, k, k, 0, n * k, k, scales_offset, 0, 0, scales_offset, 2 * n, 2, -1, scales_offset + 2 * n
    )


def payload_bytes(fmt: str, shape: tuple[int, ...] | list[int]) -> int:
    """Bytes a quantized tensor of ``fmt`` and logical ``shape`` [N, K] occupies in its layout (the container's
    ``bytes`` member); ValueError for an unknown format or a shape the layout cannot take."""
    return geometry(fmt, shape).payload_bytes
