"""Encoders and the reference decoder of the quantized formats (CPU torch, exact to the bit).

``encode(fmt, w)`` quantizes a float weight and packs it into its layout's payload; ``pack_groupwise`` /
``pack_nvfp4`` / ``pack_fp8`` pack already chosen words (a pre-quantized source checkpoint's codes and scales,
copied without requantizing); ``decode_words`` recovers those words from a payload; ``decode_ref`` is the
represented float32 matrix. Layouts and sizes: ``kernels.quant.formats``.

Encoders:
- groupwise (``MAXABS_F16_RECIP_RNE_V1``, upstream's canonical encoder): per group of the zero-padded row,
  ``amax`` in float32, ``scale16 = f16(f32(amax / qmax))`` (qmax 7/15/31/127), the subnormal rescue
  ``scale16 = 0x0001`` when a nonzero amax rounds to zero, ``inv = f32(1 / f32(scale16))``,
  ``code = clamp(round_half_even(f32(x * inv)), qmin, qmax)``; an all-zero group is scale +0 and codes 0.
  qmin is -127 for W8 (never -128). Non-finite input or an infinite scale is a ValueError.
- NVFP4 (no upstream canonical encoder: their artifacts copy a source checkpoint's words; this is ours,
  ModelOpt's recipe): ``d_w = f32(448 * 6 / amax(W))`` (1.0 for a zero matrix), block scale
  ``e4m3(min(amax(block * d_w) / 6, 448))`` rounded to nearest even, code ``e2m1(x * d_w / scale)`` rounded to
  nearest even and saturated at 6 (0 where the scale is 0).
- FP8 rows (ours): ``scale = bf16(f32(amax(row) / 448))`` (subnormal rescue to the least positive BF16),
  ``code = e4m3(clamp(x * f32(1 / scale), -448, 448))`` rounded to nearest even; a zero row is scale 0.
"""

from __future__ import annotations

import struct

import torch

from kernels.quant.formats import FP8, GROUP_FORMATS, NVFP4, NVFP4_BLOCK, geometry
from kernels.quant.weight import (
    dequantize,
    group_codes,
    swizzle_scales,
    unswizzle_scales,
    view_planes,
)

E4M3_MAX = 448.0
E2M1_MAX = 6.0


def _finite_matrix(fmt: str, w: torch.Tensor) -> torch.Tensor:
    if w.dim() != 2:
        raise ValueError(f"{fmt}: need a rank-2 weight [N, K], got shape {list(w.shape)}")
    if not w.is_floating_point():
        raise TypeError(f"{fmt}: need a floating-point weight, got {w.dtype}")
    x = w.detach().to(device="cpu", dtype=torch.float32)
    if not torch.isfinite(x).all():
        raise ValueError(f"{fmt}: the weight has NaN or infinite values")
    return x


def quantize_groupwise(fmt: str, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference encoder's words: codes int8 [N, K] and binary16 scales [N, ceil(K / G)] (logical groups)."""
    spec = GROUP_FORMATS[fmt]
    x = _finite_matrix(fmt, w)
    n, k = x.shape
    groups = -(-k // spec.group_size)
    padded = torch.zeros(n, groups * spec.group_size)
    padded[:, :k] = x  # padding lanes are zeros: they change neither amax nor any logical code
    blocks = padded.view(n, groups, spec.group_size)
    amax = blocks.abs().amax(dim=-1)
    scale16 = (amax / float(spec.qmax)).to(torch.float16)  # f32 division, then RNE to binary16
    if torch.isinf(scale16).any():
        raise ValueError(f"{fmt}: a group's scale overflows binary16 (|x| up to {amax.max().item():.3e})")
    rescue = torch.tensor(1, dtype=torch.int16).view(torch.float16)  # 0x0001 = 2^-24
    scale16 = torch.where((scale16 == 0) & (amax > 0), rescue, scale16)
    scale32 = scale16.float()
    inv = torch.where(scale32 > 0, torch.ones_like(scale32) / scale32.clamp_min(2.0**-24), 0.0)
    codes = torch.round(blocks * inv[..., None]).clamp(spec.qmin, spec.qmax)
    return codes.reshape(n, -1)[:, :k].to(torch.int8), scale16


def pack_groupwise(fmt: str, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Pack signed codes [N, K] (any int dtype, in the format's range; W8 without -128) and binary16 scales
    [N, ceil(K / G)] into a ``row-split-k128-v1`` payload (uint8, CPU)."""
    spec = GROUP_FORMATS[fmt]
    n, k = codes.shape
    geo = geometry(fmt, (n, k))
    group = spec.group_size
    if scales.dtype != torch.float16 or tuple(scales.shape) != (n, -(-k // group)):
        raise TypeError(
            f"{fmt}: scales must be float16 [{n}, {-(-k // group)}], got {scales.dtype} {scales.shape}"
        )
    c = codes.to(device="cpu", dtype=torch.int32)
    if int(c.min()) < spec.qmin or int(c.max()) > spec.qmax:
        raise ValueError(f"{fmt}: codes outside [{spec.qmin}, {spec.qmax}]")
    full = torch.zeros(n, geo.k_pad, dtype=torch.int32)
    full[:, :k] = c
    u = full & ((1 << spec.bits) - 1)
    payload = torch.zeros(geo.payload_bytes, dtype=torch.uint8)
    if spec.bits == 8:
        base = u
    else:
        base = (u[:, 0::2] & 15) | ((u[:, 1::2] & 15) << 4)
        if spec.bits > 4:
            extra = spec.bits - 4
            per_byte = 8 // extra
            hi = (u >> 4).view(n, -1, per_byte)
            shifts = torch.arange(per_byte, dtype=torch.int32) * extra
            high = (hi << shifts).sum(dim=-1)
            payload[geo.high_offset : geo.high_offset + geo.high_bytes] = high.reshape(-1).to(torch.uint8)
    payload[: geo.codes_bytes] = base.reshape(-1).to(torch.uint8)
    full_scales = torch.zeros(n, geo.groups_per_row, dtype=torch.float16)
    full_scales[:, : scales.shape[1]] = scales.cpu()
    payload[geo.scales_offset :] = full_scales.reshape(-1).view(torch.uint8)
    return payload


def e2m1_round(v: torch.Tensor) -> torch.Tensor:
    """E2M1 words (uint8, 0..15) nearest to float32 ``v``, ties to the even word, saturating at +-6; bit 3 is
    the sign (set for negative values, also those that round to zero)."""
    mag = v.abs()
    bounds = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    index = (mag[..., None] > bounds).sum(dim=-1)
    index += (mag[..., None] == bounds[[1, 3, 5]]).any(dim=-1).long()  # a tie above an odd word goes up
    return (index | ((v < 0).long() << 3)).to(torch.uint8)


def quantize_nvfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Our NVFP4 encoder's words: packed codes uint8 [N, K/2], natural E4M3 scale words uint8 [N, K/16] and
    the FP32 weight divisor (see the module docstring)."""
    x = _finite_matrix(NVFP4, w)
    geometry(NVFP4, tuple(x.shape))
    n, k = x.shape
    amax = x.abs().max()
    divisor = torch.tensor(1.0) if amax == 0 else torch.tensor(E4M3_MAX * E2M1_MAX) / amax
    if not torch.isfinite(divisor):
        raise ValueError(
            f"{NVFP4}: weight divisor {divisor.item()} is not finite (|W| max {amax.item():.3e})"
        )
    blocks = (x * divisor).view(n, k // NVFP4_BLOCK, NVFP4_BLOCK)
    scale = (blocks.abs().amax(dim=-1) / E2M1_MAX).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    scale32 = scale.float()
    ratio = torch.where(scale32[..., None] > 0, blocks / scale32.clamp_min(2.0**-9)[..., None], 0.0)
    codes = e2m1_round(ratio).reshape(n, k)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed, scale.view(torch.uint8), float(divisor)


def pack_nvfp4(packed_codes: torch.Tensor, scales: torch.Tensor, divisor: float) -> torch.Tensor:
    """Pack NVFP4 words (codes uint8 [N, K/2], natural E4M3FN scale words uint8 [N, K/16], the FP32 weight
    divisor) into a ``blockscale-k16-m128x4-v1`` payload (uint8, CPU). Scales must be non-negative and finite."""
    n, half = packed_codes.shape
    geo = geometry(NVFP4, (n, 2 * half))
    if packed_codes.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise TypeError(f"{NVFP4}: codes and scale words are uint8, got {packed_codes.dtype}, {scales.dtype}")
    if tuple(scales.shape) != (n, geo.groups_per_row):
        raise ValueError(f"{NVFP4}: scales must be [{n}, {geo.groups_per_row}], got {list(scales.shape)}")
    if bool(((scales & 0x80) != 0).any() | (scales == 0x7F).any()):
        raise ValueError(f"{NVFP4}: scale words must be non-negative finite E4M3FN")
    word = struct.pack("<f", divisor)
    if not (struct.unpack("<f", word)[0] > 0 and struct.unpack("<f", word)[0] != float("inf")):
        raise ValueError(f"{NVFP4}: weight divisor {divisor!r} must be finite and positive")
    payload = torch.zeros(geo.payload_bytes, dtype=torch.uint8)
    payload[: geo.codes_bytes] = packed_codes.cpu().reshape(-1)
    payload[geo.scales_offset : geo.scales_offset + geo.scales_bytes] = swizzle_scales(scales.cpu())
    payload[geo.divisor_offset :] = torch.frombuffer(bytearray(word), dtype=torch.uint8)
    return payload


def quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Our FP8-rows encoder's words: E4M3FN codes uint8 [N, K] and BF16 row scales [N]."""
    x = _finite_matrix(FP8, w)
    amax = x.abs().amax(dim=1)
    scale = (amax / E4M3_MAX).to(torch.bfloat16)
    if torch.isinf(scale).any():
        raise ValueError(f"{FP8}: a row scale overflows bf16")
    rescue = torch.tensor(1, dtype=torch.int16).view(torch.bfloat16)  # the least positive bf16
    scale = torch.where((scale == 0) & (amax > 0), rescue, scale)
    scale32 = scale.float()
    inv = torch.where(scale32 > 0, torch.ones_like(scale32) / scale32.clamp_min(1e-45), 0.0)
    codes = (x * inv[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return codes.view(torch.uint8), scale


def pack_fp8(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Pack E4M3FN code bytes uint8 [N, K] (no NaN words) and BF16 row scales [N] (non-negative, finite) into a
    ``row-scale-v1`` payload (uint8, CPU)."""
    n, k = codes.shape
    geo = geometry(FP8, (n, k))
    if codes.dtype != torch.uint8 or scales.dtype != torch.bfloat16 or tuple(scales.shape) != (n,):
        raise TypeError(
            f"{FP8}: need uint8 codes [N, K] and bf16 scales [N], got {codes.dtype}, {scales.dtype}"
        )
    if bool(((codes & 0x7F) == 0x7F).any()):
        raise ValueError(f"{FP8}: NaN code words")
    if bool((~torch.isfinite(scales.float())).any() | (scales.view(torch.int16) < 0).any()):
        raise ValueError(f"{FP8}: row scales must be non-negative and finite")
    payload = torch.zeros(geo.payload_bytes, dtype=torch.uint8)
    payload[: geo.codes_bytes] = codes.cpu().reshape(-1)
    payload[geo.scales_offset :] = scales.cpu().view(torch.uint8)
    return payload


def encode(fmt: str, w: torch.Tensor) -> torch.Tensor:
    """Quantize a float weight [N, K] with ``fmt``'s encoder and pack it: the payload (uint8 1-D, CPU) exactly as
    the container stores it. Per-tensor scalars live inside the payload (NVFP4's weight divisor, its last 4
    bytes); an NVFP4 site's input divisor is calibration, a separate FP32 object, not produced here."""
    if fmt in GROUP_FORMATS:
        return pack_groupwise(fmt, *quantize_groupwise(fmt, w))
    if fmt == NVFP4:
        return pack_nvfp4(*quantize_nvfp4(w))
    if fmt == FP8:
        return pack_fp8(*quantize_fp8(w))
    raise ValueError(f"unknown quantized format {fmt!r}")


def _as_payload(payload: torch.Tensor | bytes | bytearray | memoryview) -> torch.Tensor:
    if isinstance(payload, torch.Tensor):
        return payload.contiguous()
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8)


def decode_words(
    fmt: str, payload: torch.Tensor | bytes | bytearray | memoryview, shape: tuple[int, int] | list[int]
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """A payload's logical words: row-split: (signed codes int32 [N, K], binary16 scales [N, groups]);
    NVFP4: (E2M1 words uint8 [N, K], natural E4M3 scale words uint8 [N, K/16], divisor); FP8: (E4M3 words
    uint8 [N, K], bf16 scales [N]). The third item is the NVFP4 divisor (1.0 for the others)."""
    qw = view_planes(fmt, _as_payload(payload), shape)
    n, k = qw.shape
    if fmt in GROUP_FORMATS:
        return group_codes(qw)[:, :k], qw.scales.clone(), 1.0
    if fmt == NVFP4:
        words = torch.stack([qw.codes & 15, qw.codes >> 4], dim=-1).reshape(n, k)
        return words, unswizzle_scales(qw.scales, n, k).clone(), qw.divisor
    return qw.codes.clone(), qw.scales.clone(), 1.0


def decode_ref(
    fmt: str, payload: torch.Tensor | bytes | bytearray | memoryview, shape: tuple[int, int] | list[int]
) -> torch.Tensor:
    """The represented weight of a payload, float32 [N, K], exact to the bit (``dequantize`` on its planes)."""
    return dequantize(view_planes(fmt, _as_payload(payload), shape))
