"""Bit-exact codecs of the quantized formats (kernels.quant): hand-computed payload bytes and decoded values
(K padding, subnormal scales, the W8 -128 rule, the Q5/Q6 high-bit streams, the NVFP4 scale swizzle and
divisor, FP8 row scales), the published payload sizes, the reference encoder against an independent scalar
oracle, encode -> decode round trips and the refusals."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from kernels.quant import (
    FP8,
    NVFP4,
    Q4,
    Q5,
    Q6,
    W8,
    decode_ref,
    decode_words,
    dequantize,
    encode,
    geometry,
    pack_fp8,
    pack_groupwise,
    pack_nvfp4,
    payload_bytes,
    quantize_groupwise,
    view_planes,
)
from kernels.quant.weight import e4m3_table


def _f16(bits: int) -> float:
    return float(np.array([bits], dtype=np.uint16).view(np.float16)[0])


def _scales(fmt: str, payload: torch.Tensor, shape: tuple[int, int]) -> list[int]:
    geo = geometry(fmt, shape)
    return payload[geo.scales_offset :].view(torch.int16).tolist()


@pytest.mark.parametrize(
    ("fmt", "shape", "size"),
    [(NVFP4, (128, 64), 4612), (Q4, (128, 128), 8704), (FP8, (128, 64), 8448), (Q5, (2, 130), 528),
     (Q4, (1, 1), 260), (W8, (3, 40), 512 + 3 * 4 * 2), (Q6, (4, 128), 256 + 256 + 4 * 2 * 2)],
)  # fmt: skip
def test_published_payload_sizes(fmt, shape, size):
    assert payload_bytes(fmt, shape) == size
    assert encode(fmt, torch.randn(*shape)).numel() == size


def test_q5_plane_offsets_of_the_published_example():
    geo = geometry(Q5, (2, 130))
    assert (geo.k_pad, geo.groups_per_row, geo.codes_bytes, geo.high_bytes, geo.scales_bytes) == (
        256,
        4,
        256,
        64,
        16,
    )
    assert (geo.high_offset, geo.scales_offset, geo.payload_bytes) == (256, 512, 528)
    geo = geometry(NVFP4, (128, 64))
    assert (geo.scales_offset, geo.scales_bytes, geo.divisor_offset) == (4096, 512, 4608)


def test_q4_single_weight_bytes():
    """[[0.7]]: scale f16(0.7 / 7) = 0x2E66, inv = f32(1 / scale), 0.7 * inv = 7.0017 -> code 7; K pads to 128
    (two groups: the second wholly padding, scale 0)."""
    payload = encode(Q4, torch.tensor([[0.7]]))
    expected = torch.zeros(260, dtype=torch.uint8)
    expected[0] = 0x07
    expected[256:258] = torch.tensor([0x66, 0x2E], dtype=torch.uint8)
    assert torch.equal(payload, expected)
    assert decode_ref(Q4, payload, (1, 1)).item() == 7 * _f16(0x2E66)


def test_q4_rounding_ties_to_even_and_nibble_order():
    """amax 7 gives scale 1.0: codes are round-half-even of x; lane 2j in the low nibble of byte j."""
    x = torch.tensor([[7.0, 2.5, -2.5, 1.5, -1.5, 0.5, -0.5, -7.0] + [0.0] * 56])
    codes, scales = quantize_groupwise(Q4, x)
    assert codes[0, :8].tolist() == [7, 2, -2, 2, -2, 0, 0, -7]
    assert scales.view(torch.int16).tolist() == [[0x3C00]]
    payload = pack_groupwise(Q4, codes, scales)
    assert payload[:4].tolist() == [0x27, 0x2E, 0x0E, 0x90]  # (7, 2), (-2 = 0xE, 2), (-2, 0), (0, -7 = 0x9)
    assert decode_ref(Q4, payload, (1, 64))[0, :8].tolist() == [7.0, 2.0, -2.0, 2.0, -2.0, 0.0, 0.0, -7.0]


def test_q4_code_minus_eight_decodes():
    codes = torch.full((1, 64), -8)
    payload = pack_groupwise(Q4, codes, torch.tensor([[0.5]], dtype=torch.float16))
    assert payload[0].item() == 0x88
    assert decode_ref(Q4, payload, (1, 64)).unique().tolist() == [-4.0]


def test_k_padding():
    """K = 130 pads to 256: group 2 has two logical lanes (its scale from them only), group 3 is all padding
    (scale 0x0000, codes 0); the decode shows only the 130 logical columns."""
    x = torch.zeros(2, 130)
    x[:, :128] = torch.randn(2, 128)
    x[:, 128:] = torch.tensor([[1.4, -0.7], [0.0, 0.0]])
    payload = encode(Q5, x)
    geo = geometry(Q5, (2, 130))
    scales = _scales(Q5, payload, (2, 130))
    # row 0, group 2: 1.4 / 15 = 1.4933 * 2^-4 -> exponent 11, mantissa round(0.4933 * 1024) = 505: 0x2DF9
    assert scales[2] == (11 << 10) + 505 and _f16(0x2DF9) == (1 + 505 / 1024) / 16
    assert scales[3] == 0 and scales[6] == 0 and scales[7] == 0  # padding group; row 1's zero group 2 too
    codes, _, _ = decode_words(Q5, payload, (2, 130))
    assert codes.shape == (2, 130) and codes[0, 128:].tolist() == [15, -8]
    base = payload[: geo.codes_bytes].view(2, 128)
    assert base[0, 65:].eq(0).all() and base[1, 64:].eq(0).all()  # lanes 130.. of row 0, 128.. of row 1
    assert decode_ref(Q5, payload, (2, 130)).shape == (2, 130)


def test_subnormal_scales_and_the_rescue():
    """amax 7 * 2^-20 gives the subnormal scale 2^-20 (0x0010); amax 3e-8 gives f16(3e-8 / 7) = 0, rescued to
    0x0001 (2^-24), and 3e-8 * 2^24 = 0.503 rounds to code 1."""
    x = torch.zeros(2, 64)
    x[0, 0], x[0, 1] = 7 * 2.0**-20, -3 * 2.0**-20
    x[1, 0] = 3e-8
    codes, scales = quantize_groupwise(Q4, x)
    assert scales.view(torch.int16)[:, 0].tolist() == [0x0010, 0x0001]
    assert codes[0, :2].tolist() == [7, -3] and codes[1, 0].item() == 1
    decoded = decode_ref(Q4, pack_groupwise(Q4, codes, scales), (2, 64))
    assert decoded[0, :2].tolist() == [7 * 2.0**-20, -3 * 2.0**-20] and decoded[1, 0].item() == 2.0**-24


def test_all_zero_group_is_positive_zero_scale():
    codes, scales = quantize_groupwise(Q6, torch.zeros(1, 64))
    assert scales.view(torch.int16).tolist() == [[0]] and codes.eq(0).all()


def test_w8_never_emits_minus_128():
    """W8's codes are [-127, 127]: -amax encodes to -127 (byte 0x81), never 0x80; packing -128 is refused."""
    x = torch.linspace(-1.0, 1.0, 32)[None, :]
    codes, scales = quantize_groupwise(W8, x)
    assert codes.min().item() == -127 and codes.max().item() == 127
    payload = pack_groupwise(W8, codes, scales)
    assert payload[0].item() == 0x81 and not payload[: geometry(W8, (1, 32)).codes_bytes].eq(0x80).any()
    assert decode_ref(W8, payload, (1, 32))[0, 0].item() == -127 * scales.float().item()
    with pytest.raises(ValueError, match="outside"):
        pack_groupwise(W8, torch.full((1, 32), -128), scales)


def test_q5_high_bit_stream():
    """Lane-major bit stream: Q5 byte 0 holds bit 4 of lanes 0..7 in bits 0..7."""
    codes = torch.zeros(1, 64, dtype=torch.int32)
    codes[0, :4] = torch.tensor([-16, 15, -1, 0])  # u = 0b10000, 0b01111, 0b11111, 0
    payload = pack_groupwise(Q5, codes, torch.ones(1, 1, dtype=torch.float16))
    geo = geometry(Q5, (1, 64))
    assert payload[:2].tolist() == [0xF0, 0x0F]
    assert payload[geo.high_offset].item() == 0b101
    assert decode_words(Q5, payload, (1, 64))[0][0, :4].tolist() == [-16, 15, -1, 0]


def test_q6_high_bit_stream():
    """Q6 byte 0 holds bits 4 and 5 of lane 0 in bits 0 and 1, of lane 1 in bits 2 and 3, and so on."""
    codes = torch.zeros(1, 64, dtype=torch.int32)
    codes[0, :4] = torch.tensor([-32, 31, -1, 16])  # high bits 0b10, 0b01, 0b11, 0b01
    payload = pack_groupwise(Q6, codes, torch.ones(1, 1, dtype=torch.float16))
    geo = geometry(Q6, (1, 64))
    assert payload[:2].tolist() == [0xF0, 0x0F]
    assert payload[geo.high_offset].item() == 0b01_11_01_10
    assert decode_words(Q6, payload, (1, 64))[0][0, :4].tolist() == [-32, 31, -1, 16]


def _scalar_oracle(x: np.ndarray, qmax: int, qmin: int) -> tuple[np.ndarray, int]:
    """The reference encoder on one group in numpy scalars (float32 / float16 arithmetic, RNE everywhere)."""
    amax = np.float32(np.max(np.abs(x)))
    if amax == 0:
        return np.zeros(x.size, np.int64), 0
    scale16 = np.float16(np.float32(amax / np.float32(qmax)))
    if scale16 == 0:
        scale16 = np.array([1], np.uint16).view(np.float16)[0]
    inv = np.float32(np.float32(1.0) / np.float32(scale16))
    codes = np.clip(np.rint((x * inv).astype(np.float32)), qmin, qmax).astype(np.int64)
    return codes, int(np.array([scale16], np.float16).view(np.uint16)[0])


@pytest.mark.parametrize("fmt", [Q4, Q5, Q6, W8])
def test_encoder_matches_scalar_oracle(fmt):
    spec = {Q4: (7, -8, 64), Q5: (15, -16, 64), Q6: (31, -32, 64), W8: (127, -127, 32)}[fmt]
    x = torch.randn(8, 256) * torch.logspace(-6, 3, 8)[:, None]
    x[3] = torch.round(x[3] * 4) / 4  # exact ties after scaling
    codes, scales = quantize_groupwise(fmt, x)
    xs = x.numpy().astype(np.float32)
    for row in range(8):
        for g in range(256 // spec[2]):
            part = xs[row, g * spec[2] : (g + 1) * spec[2]]
            want_codes, want_scale = _scalar_oracle(part, spec[0], spec[1])
            assert scales[row, g].view(torch.int16).item() & 0xFFFF == want_scale, (row, g)
            assert codes[row, g * spec[2] : (g + 1) * spec[2]].tolist() == want_codes.tolist(), (row, g)


def _nvfp4_payload() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, k = 256, 128
    codes = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
    scales = (torch.arange(n * k // 16).view(n, k // 16) % 120 + 1).to(torch.uint8)
    return pack_nvfp4(codes, scales, 2.0), codes, scales


def test_nvfp4_scale_swizzle():
    """Row 130, block 5 of a [256, 128] matrix (K/64 = 2 scale tiles a row tile) is stored at byte
    (1 * 2 + 1) * 512 + 2 * 16 + 0 * 4 + 1 = 1569 of the scale plane; row 45, block 6 at 512 + 13 * 16 + 4 + 2."""
    payload, codes, scales = _nvfp4_payload()
    geo = geometry(NVFP4, (256, 128))
    plane = payload[geo.scales_offset : geo.scales_offset + geo.scales_bytes]
    assert plane[1569].item() == scales[130, 5].item()
    assert plane[726].item() == scales[45, 6].item()
    assert plane[0].item() == scales[0, 0].item() and plane[16 + 4].item() == scales[33, 0].item()
    words, natural, divisor = decode_words(NVFP4, payload, (256, 128))
    assert torch.equal(natural, scales) and divisor == 2.0
    assert torch.equal(words[:, 0::2], codes & 15) and torch.equal(words[:, 1::2], codes >> 4)
    assert payload[-4:].tolist() == list(struct.pack("<f", 2.0))


def test_nvfp4_decode_values():
    """W = e2m1(code) * e4m3(scale) / d_w: code 0x7 (6.0) x scale 0x38 (1.0) / 2 = 3; code 0xB (-1.5) x scale
    0x01 (2^-9, subnormal) / 2; the low nibble is the even column."""
    codes = torch.zeros(128, 32, dtype=torch.uint8)
    codes[0, 0] = 0xB7
    scales = torch.full((128, 4), 0x38, dtype=torch.uint8)
    scales[1, 0] = 0x01
    codes[1, 0] = 0x0B
    w = decode_ref(NVFP4, pack_nvfp4(codes, scales, 2.0), (128, 64))
    assert w[0, :2].tolist() == [3.0, -0.75] and w[1, 0].item() == -1.5 * 2.0**-9 / 2


def test_fp8_rows():
    """Codes 0x38 (1.0), 0xB8 (-1.0), 0x01 (2^-9), 0x7E (448) times the row's bf16 scale 0x4040 (3.0); the
    scales start at align_up(N * K, 256)."""
    codes = torch.zeros(2, 64, dtype=torch.uint8)
    codes[0, :4] = torch.tensor([0x38, 0xB8, 0x01, 0x7E], dtype=torch.uint8)
    scales = torch.tensor([0x4040, 0x3F80], dtype=torch.int16).view(torch.bfloat16)
    payload = pack_fp8(codes, scales)
    assert payload.numel() == 256 + 4 and payload[256:].tolist() == [0x40, 0x40, 0x80, 0x3F]
    w = decode_ref(FP8, payload, (2, 64))
    assert w[0, :4].tolist() == [3.0, -3.0, 3 * 2.0**-9, 1344.0] and w[1].eq(0).all()


def test_e4m3_table_matches_the_bits():
    table = e4m3_table()
    words = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    torch_values = words.view(torch.float8_e4m3fn).float()
    finite = (words & 0x7F) != 0x7F
    assert torch.equal(table[finite], torch_values[finite]) and table[~finite].isnan().all()
    assert table[0x7E].item() == 448.0 and table[0x08].item() == 2.0**-6 and table[0x07].item() == 7 * 2.0**-9


@pytest.mark.parametrize("fmt", [Q4, Q5, Q6, W8, NVFP4, FP8])
def test_round_trip(fmt):
    """encode -> decode_words -> pack is the same payload, and the decode is within the format's step."""
    shape = (256, 384) if fmt == NVFP4 else (37, 200)
    w = torch.randn(*shape)
    payload = encode(fmt, w)
    first, second, divisor = decode_words(fmt, payload, shape)
    if fmt == NVFP4:
        repacked = pack_nvfp4(first[:, 0::2] | (first[:, 1::2] << 4), second, divisor)
    elif fmt == FP8:
        repacked = pack_fp8(first, second)
    else:
        repacked = pack_groupwise(fmt, first, second[:, : -(-shape[1] // (32 if fmt == W8 else 64))])
    assert torch.equal(repacked, payload)
    decoded = decode_ref(fmt, payload, shape)
    rel = ((decoded - w).norm() / w.norm()).item()
    assert rel < {Q4: 0.12, Q5: 0.06, Q6: 0.03, W8: 0.007, NVFP4: 0.11, FP8: 0.04}[fmt], rel


def test_row_views_of_a_fused_parent():
    for fmt, shape, cut in (
        (Q5, (300, 200), (100, 150)),
        (NVFP4, (384, 128), (128, 256)),
        (FP8, (50, 64), (7, 30)),
    ):
        payload = encode(fmt, torch.randn(*shape))
        qw = view_planes(fmt, payload, shape)
        whole = dequantize(qw)
        part = qw.rows(*cut)
        assert part.shape == (cut[1], shape[1])
        assert torch.equal(dequantize(part), whole[cut[0] : cut[0] + cut[1]])
        assert part.codes.data_ptr() == qw.codes.data_ptr() + cut[0] * qw.codes.stride(0)  # a view, no copy


def test_refusals():
    with pytest.raises(ValueError, match="unknown quantized format"):
        payload_bytes("Q3G64_F16S", (4, 64))
    with pytest.raises(ValueError, match="multiple of 128"):
        payload_bytes(NVFP4, (100, 64))
    with pytest.raises(ValueError, match="bytes, expected"):
        decode_ref(Q4, torch.zeros(100, dtype=torch.uint8), (1, 1))
    with pytest.raises(ValueError, match="NaN or infinite"):
        encode(Q4, torch.tensor([[float("nan"), 1.0]]))
    with pytest.raises(ValueError, match="overflows"):
        encode(Q4, torch.tensor([[1e9]]))
    bad = encode(NVFP4, torch.randn(128, 64))
    bad[-4:] = 0
    with pytest.raises(ValueError, match="divisor"):
        decode_ref(NVFP4, bad, (128, 64))
    with pytest.raises(ValueError, match="NaN code"):
        pack_fp8(torch.full((1, 4), 0x7F, dtype=torch.uint8), torch.ones(1, dtype=torch.bfloat16))
