"""The GEMV layout (``kernels.quant.repack``): the load-time repack is a bijection of each row's code bits
(``unpack_planes`` inverts it), lands each lane where the layout's docstring says, and a repacked weight
(``view_planes(..., repack=True)``, in place) represents exactly the stored weight: ``dequantize`` (and so
``quant_linear_ref``) follows ``QuantWeight.gemv_layout``. Pure torch, CPU."""

from __future__ import annotations

import pytest
import torch

from kernels.quant import Q4, Q5, Q6, W8, dequantize, encode, pack_groupwise, view_planes
from kernels.quant.formats import GROUP_FORMATS
from kernels.quant.repack import ROW_CHUNK, repack_planes, unpack_planes

FORMATS = [Q4, Q5, Q6, W8]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", [(37, 130), (3, 256), (1, 1000)])
def test_repack_keeps_the_weight(fmt, shape):
    payload = encode(fmt, torch.randn(*shape))
    stored = dequantize(view_planes(fmt, payload.clone(), shape))
    before = payload.clone()
    qw = view_planes(fmt, payload, shape, repack=True)
    assert qw.gemv_layout
    assert not torch.equal(payload, before)  # rewritten in place
    assert torch.equal(dequantize(qw), stored)
    part = qw.rows(1, shape[0] - 1) if shape[0] > 1 else qw
    assert torch.equal(dequantize(part), stored[shape[0] - part.shape[0] :])


@pytest.mark.parametrize("fmt", FORMATS)
def test_unpack_inverts_repack(fmt):
    n, k = 5, 384
    qw = view_planes(fmt, encode(fmt, torch.randn(n, k)), (n, k))
    codes, high = repack_planes(fmt, qw.codes, qw.high)
    assert codes.shape == qw.codes.shape and (high is None) == (qw.high is None)
    back_codes, back_high = unpack_planes(fmt, codes, high)
    assert torch.equal(back_codes.view(torch.uint8), qw.codes.view(torch.uint8))
    assert back_high is None or torch.equal(back_high, qw.high)


def _lane_value(fmt: str, codes: torch.Tensor, high: torch.Tensor | None, lane: int) -> int:
    """Row 0's offset code at ``lane``, read from the GEMV layout by the docstring's rule (independent of
    ``unpack_planes``)."""
    unit, m = divmod(lane, 128)
    raw = codes.view(torch.uint8)[0]
    if fmt == W8:
        j, i = divmod(m, 32)
        return int(raw[unit * 128 + 4 * i + j])
    s, rest = divmod(m, 32)
    i, h = divmod(rest, 2)
    j = s + 4 * h
    byte = int(raw[unit * 64 + 4 * i + j // 2])
    u = (byte >> (4 * (j % 2))) & 15
    if fmt == Q5:
        u |= ((int(high[0, unit * 16 + i]) >> j) & 1) << 4
    if fmt == Q6:
        word = int(high[0, unit * 32 + 2 * i]) | int(high[0, unit * 32 + 2 * i + 1]) << 8
        u |= ((word >> (2 * j)) & 3) << 4
    return u


@pytest.mark.parametrize("fmt", FORMATS)
def test_layout_places_each_lane(fmt):
    k = 256
    spec = GROUP_FORMATS[fmt]
    codes_q = torch.randint(spec.qmin, spec.qmax + 1, (1, k), dtype=torch.int32)
    scales = torch.ones(1, k // spec.group_size, dtype=torch.float16)

    payload = pack_groupwise(fmt, codes_q, scales)
    qw = view_planes(fmt, payload, (1, k), repack=True)
    for lane in range(k):
        got = _lane_value(fmt, qw.codes, qw.high, lane)
        assert got == int(codes_q[0, lane]) + (1 << (spec.bits - 1)), f"{fmt} lane {lane}"


def test_repack_in_row_chunks():
    n, k = ROW_CHUNK + 3, 128
    payload = encode(Q5, torch.randn(n, k))
    stored = dequantize(view_planes(Q5, payload.clone(), (n, k)))
    assert torch.equal(dequantize(view_planes(Q5, payload, (n, k), repack=True)), stored)
