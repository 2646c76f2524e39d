"""A quantized weight as typed views of its payload's planes, and its exact dequantization (``dequantize``).

``view_planes`` turns a payload (a uint8 tensor holding one object's bytes, on any device) into a
``QuantWeight``: views of the code, high-bit and scale planes with their own dtypes and row strides, no copy.
``QuantWeight.rows`` takes a row range of a fused parent the same way (three plane spans, no copy), which is
how a fused projection is bound as several logical weights. The kernels read these views; ``dequantize`` is
the reference decode, exact to the bit (float32, one rounding at most), and runs on any device.

``view_planes(..., repack=True)`` (the model's quantized linear layers, once at load) rewrites a row-split
payload's code and high planes in place into the GEMV layout (``kernels.quant.repack``: same bytes a plane,
another order within each row) and marks the weight ``gemv_layout``; every reader here and in the kernels
follows the flag, so the represented weight is the same.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, replace

import torch

from kernels.quant.formats import FP8, GROUP_FORMATS, NVFP4, NVFP4_BLOCK, W8, geometry
from kernels.quant.repack import repack_in_place, unpack_planes

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


@functools.lru_cache(maxsize=8)
def e2m1_table(device: torch.device | str = "cpu") -> torch.Tensor:
    """The 16 E2M1 words' values (float32) on ``device``: bit 3 the sign, words 0..7 the magnitudes above. Cached a
    device: a lookup inside a captured CUDA graph must not copy a table from the host."""
    mags = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    return torch.cat([mags, -mags]).to(device)


@functools.lru_cache(maxsize=8)
def e4m3_table(device: torch.device | str = "cpu") -> torch.Tensor:
    """The 256 E4M3FN words' values (float32) on ``device`` (cached, as ``e2m1_table``), decoded from the bits
    (bias 7, no infinities; 0x7f and 0xff are NaN): exponent 0 is subnormal ``m * 2^-9``, else ``(1 + m/8) *
    2^(e-7)``."""
    return _e4m3_values().to(device)


def _e4m3_values() -> torch.Tensor:
    words = torch.arange(256)
    sign = torch.where(words >= 128, -1.0, 1.0)
    exp = (words >> 3) & 15
    man = (words & 7).double()
    value = torch.where(exp == 0, man * 2.0**-9, (1 + man / 8) * torch.pow(2.0, (exp - 7).double()))
    value = sign.double() * value
    value[(words & 127) == 127] = float("nan")
    return value.float()


@dataclass(frozen=True)
class QuantWeight:
    """One quantized [N, K] weight as plane views (``view_planes``); what ``quant_linear`` takes.

    codes: uint8 [N, codes_row_bytes] (W8: int8 [N, K_pad]); high: uint8 [N, K_pad/8] (Q5) or [N, K_pad/4] (Q6),
    None otherwise; scales: float16 [N, K_pad/G] (row-split), uint8 [N/128, K/64*512] (NVFP4, swizzled tiles),
    bfloat16 [N] (FP8 rows). divisor: the NVFP4 weight divisor d_w (1.0 for the others); input_divisor: the
    NVFP4 site's activation divisor when the profile keeps one (for a W4A4 path), else None.
    """

    format: str
    shape: tuple[int, int]
    k_pad: int
    codes: torch.Tensor
    high: torch.Tensor | None
    scales: torch.Tensor
    divisor: float = 1.0
    input_divisor: float | None = None
    gemv_layout: bool = False  # row-split planes rewritten by ``kernels.quant.repack`` (the GEMV's layout)

    @property
    def device(self) -> torch.device:
        return self.codes.device

    def rows(self, begin: int, count: int) -> QuantWeight:
        """Rows [begin, begin + count) as a weight of their own: views of the same planes (no copy). NVFP4
        rows come in whole 128-row scale tiles."""
        n = self.shape[0]
        if begin < 0 or count <= 0 or begin + count > n:
            raise IndexError(f"rows [{begin}, {begin + count}) outside a weight of {n} rows")
        if self.format == NVFP4:
            if begin % 128 or count % 128:
                raise ValueError(
                    f"{NVFP4} row views need whole 128-row tiles, got [{begin}, {begin + count})"
                )
            scales = self.scales[begin // 128 : (begin + count) // 128]
        else:
            scales = self.scales[begin : begin + count]
        high = None if self.high is None else self.high[begin : begin + count]
        return replace(
            self,
            shape=(count, self.shape[1]),
            codes=self.codes[begin : begin + count],
            high=high,
            scales=scales,
        )


def _divisor(word: bytes) -> float:
    value = struct.unpack("<f", word)[0]
    if not (value > 0 and value != float("inf")):
        raise ValueError(f"{NVFP4} weight divisor {value!r}: must be finite and positive")
    return value


def view_planes(
    fmt: str,
    payload: torch.Tensor,
    shape: tuple[int, int] | list[int],
    divisor: float | None = None,
    input_divisor: float | None = None,
    repack: bool = False,
) -> QuantWeight:
    """A payload (contiguous 1-D uint8, exactly ``payload_bytes(fmt, shape)`` long) as typed plane views.

    NVFP4's weight divisor is read from the payload's last 4 bytes unless ``divisor`` is given (a device
    payload then needs no host read). ``repack`` (row-split formats; ignored for the others): rewrite the
    payload's code and high planes IN PLACE into the GEMV layout (``kernels.quant.repack``) and return the
    weight marked ``gemv_layout``; call it once per payload.
    """
    geo = geometry(fmt, shape)
    if payload.dtype != torch.uint8 or payload.dim() != 1 or not payload.is_contiguous():
        raise TypeError(
            f"{fmt} payload: need a contiguous 1-D uint8 tensor, got {payload.dtype} {payload.shape}"
        )
    if payload.numel() != geo.payload_bytes:
        raise ValueError(
            f"{fmt} {list(shape)} payload has {payload.numel()} bytes, expected {geo.payload_bytes}"
        )
    n = geo.n
    codes = payload[: geo.codes_bytes].view(n, geo.codes_row_bytes)
    if fmt == W8:
        codes = codes.view(torch.int8)
    high = payload[geo.high_offset : geo.high_offset + geo.high_bytes].view(n, -1) if geo.high_bytes else None
    raw_scales = payload[geo.scales_offset : geo.scales_offset + geo.scales_bytes]
    if fmt in GROUP_FORMATS:
        scales = raw_scales.view(torch.float16).view(n, geo.groups_per_row)
    elif fmt == NVFP4:
        scales = raw_scales.view(n // 128, -1)
        if divisor is None:
            divisor = _divisor(bytes(payload[geo.divisor_offset :].cpu().numpy().tobytes()))
    else:
        scales = raw_scales.view(torch.bfloat16)
    packed = repack and fmt in GROUP_FORMATS
    if packed:
        repack_in_place(fmt, codes, high)
    return QuantWeight(
        fmt, (n, geo.k), geo.k_pad, codes, high, scales, float(divisor or 1.0), input_divisor, packed
    )


def unswizzle_scales(tiles: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """NVFP4 scale words from the swizzled 128x4 tiles back to natural [N, K/16] order."""
    return tiles.reshape(n // 128, k // 64, 32, 4, 4).permute(0, 3, 2, 1, 4).reshape(n, k // NVFP4_BLOCK)


def swizzle_scales(natural: torch.Tensor) -> torch.Tensor:
    """Natural [N, K/16] NVFP4 scale words to the stored order (1-D): byte ``(row_tile * K/64 + col // 4) * 512 +
    (row % 32) * 16 + (row % 128 // 32) * 4 + col % 4`` for the scale of row ``row``, block ``col``."""
    n, groups = natural.shape
    return natural.reshape(n // 128, 4, 32, groups // 4, 4).permute(0, 3, 2, 1, 4).reshape(-1)


def group_codes(qw: QuantWeight) -> torch.Tensor:
    """The signed codes of a row-split weight, int32 [N, K_pad] (padding lanes included)."""
    spec = GROUP_FORMATS[qw.format]
    n = qw.shape[0]
    if qw.gemv_layout:
        codes, high = unpack_planes(qw.format, qw.codes, qw.high)
        return group_codes(replace(qw, codes=codes, high=high, gemv_layout=False))
    if spec.bits == 8:
        return qw.codes.to(torch.int32)
    base = qw.codes.to(torch.int32)
    u = torch.stack([base & 15, base >> 4], dim=-1).reshape(n, qw.k_pad)
    if qw.high is not None:
        extra = spec.bits - 4  # bits a lane in the high stream
        per_byte = 8 // extra
        shifts = torch.arange(per_byte, device=base.device, dtype=torch.int32) * extra
        bits = (qw.high.to(torch.int32)[..., None] >> shifts) & ((1 << extra) - 1)
        u = u | (bits.reshape(n, qw.k_pad) << 4)
    sign = 1 << (spec.bits - 1)
    return (u ^ sign) - sign


def dequantize(qw: QuantWeight) -> torch.Tensor:
    """The represented weight, float32 [N, K], exact to the bit, on the weight's device.

    Row-split: ``f32(scale16) * code`` (exact). NVFP4: ``f32(e2m1 * e4m3) / d_w`` (the product is exact, one
    rounding for the division). FP8 rows: ``e4m3 * bf16 scale`` (exact for normal results).
    """
    n, k = qw.shape
    device = qw.codes.device
    if qw.format in GROUP_FORMATS:
        group = GROUP_FORMATS[qw.format].group_size
        scales = qw.scales.float().repeat_interleave(group, dim=1)
        return (group_codes(qw).float() * scales)[:, :k]
    if qw.format == NVFP4:
        table = e2m1_table(device)
        codes = qw.codes.long()
        values = table[torch.stack([codes & 15, codes >> 4], dim=-1).reshape(n, k)]
        scales = e4m3_table(device)[unswizzle_scales(qw.scales, n, k).long()]
        return values * scales.repeat_interleave(NVFP4_BLOCK, dim=1) / float(qw.divisor)  # a float32 scalar
    assert qw.format == FP8, qw.format
    return e4m3_table(device)[qw.codes.long()] * qw.scales.float()[:, None]
