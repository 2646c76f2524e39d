"""The GEMV layout of the row-split groupwise formats (Q4/Q5/Q6/W8): a load-time permutation of each row's code
bits that the decode GEMV (``triton_gemv.py``) reads with one 16-byte load a thread and unpacks with a few
word-wide bit operations. Pure torch; ``repack_planes`` and ``unpack_planes`` are each other's inverse.

The stored format (``row-split-k128-v1``, ``formats.py``) is unchanged on disk: ``view_planes(..., repack=True)``
rewrites a payload's code and high planes in place once at load (same sizes, same plane offsets; the scale
plane is untouched) and marks the ``QuantWeight`` ``gemv_layout``. The permutation is row-local, so row views of
a fused parent (``QuantWeight.rows``) stay plain slices. Per row, in units of 128 lanes (K_pad is a multiple
of 128), with ``u = code + 2^(bits-1)`` the offset code (unsigned; ``code = u - OFFSET``):

- Q4/Q5/Q6 base plane: 16 little-endian 32-bit words a unit; nibble ``j`` (bits 4j..4j+3) of word ``i`` holds
  the low 4 bits of ``u`` of lane ``lane(j, i) = 32 (j % 4) + 2 i + j // 4``. So ``(w >> 4s) & 0x000F000F``
  (s = 0..3) puts lanes ``32 s + 2i`` and ``32 s + 2i + 1`` (K-adjacent) in the two halves of one word: made
  16-bit floats, it is the packed pair a tensor-core operand register holds, and pair plane ``s`` of a
  [rows, 16] word tile is the 32 consecutive lanes ``[32 s, 32 s + 32)`` (x's slice for it is contiguous);
  pair planes 0-1 are the unit's first group of 64, 2-3 its second.
- Q5 high plane: 16 bytes a unit; bit ``j`` of byte ``i`` is bit 4 of ``u`` of lane ``lane(j, i)``.
- Q6 high plane: 16 little-endian 16-bit words a unit; bits ``2j, 2j+1`` of word ``i`` are bits 4, 5 of ``u`` of
  lane ``lane(j, i)``.
- W8: 32 words a unit; byte ``j`` of word ``i`` is ``u = code + 128`` (1..255) of lane ``32 j + i`` (plane ``j`` is
  the unit's group ``j`` of 32).
"""

from __future__ import annotations

import torch

from kernels.quant.formats import GROUP_FORMATS

UNIT = 128  # lanes a unit (K_pad is a multiple)
ROW_CHUNK = 1024  # rows rewritten at a time by ``repack_in_place`` (bounds its temporary memory)


def _codes_u(codes: torch.Tensor, high: torch.Tensor | None, bits: int) -> torch.Tensor:
    """The offset codes ``u`` (int32 [rows, K_pad]) of stored row-split planes (lane order)."""
    rows = codes.shape[0]
    if bits == 8:
        return codes.view(torch.int8).to(torch.int32) + 128
    base = codes.to(torch.int32)
    u = torch.stack([base & 15, base >> 4], dim=-1).reshape(rows, -1)
    if high is not None:
        extra = bits - 4
        shifts = torch.arange(8 // extra, device=codes.device, dtype=torch.int32) * extra
        hb = (high.to(torch.int32)[..., None] >> shifts) & ((1 << extra) - 1)
        u = u | (hb.reshape(rows, -1) << 4)
    sign = 1 << (bits - 1)
    return u ^ sign  # two's complement code -> code + 2^(bits-1)


def _pack_u(u: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Offset codes (int32 [rows, K_pad], lane order) -> GEMV-layout (codes bytes, high bytes or None)."""
    rows, k_pad = u.shape
    units = k_pad // UNIT
    if bits == 8:
        t = u.reshape(rows, units, 4, 32).permute(0, 1, 3, 2)  # [rows, unit, word i, byte j]
        return t.reshape(rows, k_pad).to(torch.uint8), None
    # lane 32 s + 2 i + h -> [unit, s, i, h] -> word i, nibble j = s + 4 h
    t = u.reshape(rows, units, 4, 16, 2).permute(0, 1, 3, 4, 2).reshape(rows, units, 16, 8)
    low = t & 15
    codes = (low[..., 0::2] | (low[..., 1::2] << 4)).reshape(rows, k_pad // 2).to(torch.uint8)
    if bits == 4:
        return codes, None
    j = torch.arange(8, device=u.device, dtype=torch.int32)
    if bits == 5:
        h = (((t >> 4) & 1) << j).sum(-1)  # [rows, unit, 16]: one byte a word
        return codes, h.reshape(rows, k_pad // 8).to(torch.uint8)
    h = (((t >> 4) & 3) << (2 * j)).sum(-1)  # 16 bits a word, little-endian bytes
    h = torch.stack([h & 255, h >> 8], dim=-1)
    return codes, h.reshape(rows, k_pad // 4).to(torch.uint8)


def _unpack_u(codes: torch.Tensor, high: torch.Tensor | None, bits: int) -> torch.Tensor:
    """GEMV-layout planes -> offset codes (int32 [rows, K_pad], lane order): ``_pack_u``'s inverse."""
    rows = codes.shape[0]
    if bits == 8:
        k_pad = codes.shape[1]
        t = codes.view(torch.uint8).to(torch.int32).reshape(rows, k_pad // UNIT, 32, 4)
        return t.permute(0, 1, 3, 2).reshape(rows, k_pad)
    k_pad = codes.shape[1] * 2
    base = codes.to(torch.int32).reshape(rows, k_pad // UNIT, 16, 4)
    t = torch.stack([base & 15, base >> 4], dim=-1).reshape(rows, k_pad // UNIT, 16, 8)
    j = torch.arange(8, device=codes.device, dtype=torch.int32)
    if bits == 5:
        assert high is not None
        h = high.to(torch.int32).reshape(rows, k_pad // UNIT, 16, 1)
        t = t | (((h >> j) & 1) << 4)
    elif bits == 6:
        assert high is not None
        hb = high.to(torch.int32).reshape(rows, k_pad // UNIT, 16, 2)
        h = (hb[..., 0] | (hb[..., 1] << 8))[..., None]
        t = t | (((h >> (2 * j)) & 3) << 4)
    # [unit, i, j = s + 4 h] -> lane 32 s + 2 i + h
    return t.reshape(rows, k_pad // UNIT, 16, 2, 4).permute(0, 1, 4, 2, 3).reshape(rows, k_pad)


def _stored_planes(u: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Offset codes (lane order) -> the stored row-split (codes, high) planes."""
    rows, k_pad = u.shape
    code = u ^ (1 << (bits - 1))
    if bits == 8:
        return (((code + 128) & 255) - 128).to(torch.int8), None
    low = code & 15
    codes = (low[:, 0::2] | (low[:, 1::2] << 4)).to(torch.uint8)
    if bits == 4:
        return codes, None
    extra = bits - 4
    per_byte = 8 // extra
    shifts = torch.arange(per_byte, device=u.device, dtype=torch.int32) * extra
    hb = ((code >> 4) & ((1 << extra) - 1)).reshape(rows, k_pad // per_byte, per_byte)
    return codes, (hb << shifts).sum(-1).to(torch.uint8)


def repack_planes(
    fmt: str, codes: torch.Tensor, high: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Stored row-split planes (codes uint8 [rows, bytes] or int8 for W8, high uint8 or None) -> new tensors of
    the same shapes (uint8) in the GEMV layout (module docstring)."""
    bits = GROUP_FORMATS[fmt].bits
    return _pack_u(_codes_u(codes.view(torch.uint8) if bits != 8 else codes, high, bits), bits)


def unpack_planes(
    fmt: str, codes: torch.Tensor, high: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """GEMV-layout planes -> the stored row-split planes (``repack_planes``' inverse; codes uint8, W8 int8)."""
    bits = GROUP_FORMATS[fmt].bits
    return _stored_planes(_unpack_u(codes, high, bits), bits)


def repack_in_place(fmt: str, codes: torch.Tensor, high: torch.Tensor | None) -> None:
    """Rewrite plane views (of one payload) into the GEMV layout in place, ``ROW_CHUNK`` rows at a time."""
    for r0 in range(0, codes.shape[0], ROW_CHUNK):
        r1 = min(codes.shape[0], r0 + ROW_CHUNK)
        part_high = None if high is None else high[r0:r1]
        new_codes, new_high = repack_planes(fmt, codes[r0:r1], part_high)
        codes[r0:r1].view(torch.uint8).copy_(new_codes)
        if high is not None:
            assert new_high is not None
            high[r0:r1].copy_(new_high)
