"""The GEMV-layout decode GEMV (``kernels.quant.triton_gemv``, launched by ``quant_linear`` for a weight that
``view_planes(..., repack=True)`` rewrote) vs ``quant_linear_ref`` (dequantize + fp32 matmul) for Q4/Q5/Q6/W8:
T = 1..8, odd N and K (padding lanes, clamped rows), split K, every tile variant of ``GEMV_VARIANTS`` (both
modes: tensor cores for any T, CUDA cores for T = 1), fp16 x, row views of a fused parent with strided x,
bitwise batch invariance, and the layout's dequantize kernel (the prefill route). Under TRITON_INTERPRET=1 on
the CPU too."""

from __future__ import annotations

import pytest
import torch

import kernels._dispatch
from kernels.quant import Q4, Q5, Q6, W8, dequantize, encode, quant_linear, quant_linear_ref, view_planes
from kernels.quant.packed_linear import GEMV_VARIANTS, PackedTiles, packed_tiles

# NOTE: interpreter_fixes (conftest.py): Triton 3.6's interpreter multiplies bf16 dot operands as raw integers
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("interpreter_fixes")]

FORMATS = [Q4, Q5, Q6, W8]
RMS = 6e-3  # bf16 output rounding (the interpreter truncates: ~4e-3) and fp32 summation order
ELEMENT = 2.0**-7  # per element, relative to sum |x_k w_k|


def _weight(fmt: str, n: int, k: int, device: str):
    payload = encode(fmt, torch.randn(n, k) * k**-0.5)
    return view_planes(fmt, payload.to(device), (n, k), repack=True)


def _check(name, got, x, qw, assert_close):
    expected = quant_linear_ref(x, qw)
    assert got.dtype == x.dtype and got.shape == expected.shape, name
    assert_close(name, got, expected, RMS, 0.0)
    magnitude = x.double().abs() @ dequantize(qw).double().abs().t()
    worst = ((got.double() - expected.double()).abs() / (magnitude * ELEMENT + 1e-30)).max().item()
    assert worst <= 1.0, f"{name}: an element is {worst:.2f}x past its bound"


SHAPES = [(37, 130), (64, 320), (20, 1024)]


def _check_row_view(fmt, variant, device, assert_close, scale=1.0):
    """``variant``'s tiles on rows 100:150 of a fused parent [300, 640] (a row view), x a column slice."""
    part = _weight(fmt, 300, 640, device).rows(100, 150)
    x = torch.randn(1, 640, device=device).bfloat16() * scale
    tiles = packed_tiles(fmt, 50, 640, variant)
    _check(
        f"{fmt} rows 100:150 {tiles}", quant_linear(x, part, route="gemv", tiles=tiles), x, part, assert_close
    )


def _check_tensor_core_rows(fmt, n, k, variant, device, assert_close):
    """A tensor-core variant ("mma" or "mma_ring") on 1, 3 and 8 rows of x (a column slice): against the reference;
    on the GPU each row of a batch bitwise the row alone (the interpreter runs "fma" for one row, "dot" for several),
    and a ring bitwise the "mma" kernel on the same tiles, also with NINFER_SPLITK_REDUCE=last where K is split."""
    qw = _weight(fmt, n, k, device)
    tiles = packed_tiles(fmt, n, k, variant)
    assert tiles.mode in ("mma", "mma_ring") and tiles.block_n % (16 * tiles.num_warps) == 0, tiles
    x8 = torch.randn(8, k + 8, device=device).bfloat16()[:, 4 : 4 + k]
    alone = [quant_linear(x8[t : t + 1], qw, route="gemv", tiles=tiles) for t in range(8)]
    for rows in (1, 3, 8):
        x = x8[:rows]
        out = quant_linear(x, qw, route="gemv", tiles=tiles)
        _check(f"{fmt} {n}x{k} T{rows} {tiles}", out, x, qw, assert_close)
        if device == "cpu":
            continue
        for t in range(rows):
            assert torch.equal(out[t], alone[t][0]), f"{fmt} {n}x{k} T{rows} row {t} differs from alone"
        if tiles.mode == "mma_ring":
            mma = tiles._replace(mode="mma", num_stages=1)
            assert torch.equal(out, quant_linear(x, qw, route="gemv", tiles=mma)), f"{fmt} {n}x{k} T{rows}"
            if (
                tiles.split_k > 1
            ):  # NINFER_SPLITK_REDUCE=last: the last split sums the partials, the same bits
                with pytest.MonkeyPatch.context() as patch:
                    patch.setattr(kernels._dispatch, "SPLITK_REDUCE", "last")
                    last = quant_linear(x, qw, route="gemv", tiles=tiles)
                assert torch.equal(last, out), f"{fmt} {n}x{k} T{rows}: the last split's sum differs"


@pytest.mark.parametrize("rows", [1, 2, 5, 8])
@pytest.mark.parametrize("fmt", FORMATS)
def test_gemv(fmt, rows, device, assert_close):
    for n, k in SHAPES:
        qw = _weight(fmt, n, k, device)
        x = torch.randn(rows, k, device=device).bfloat16()
        tiles = packed_tiles(fmt, n, k)
        _check(f"{fmt} T={rows} {n}x{k} {tiles}", quant_linear(x, qw), x, qw, assert_close)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_variant(fmt, device, assert_close):
    n, k = 40, 512  # 4 units: split K and two-unit steps both apply
    qw = _weight(fmt, n, k, device)
    x8 = torch.randn(8, k, device=device).bfloat16()
    for name in GEMV_VARIANTS:
        tiles = packed_tiles(fmt, n, k, name)
        x = x8 if tiles.mode in ("dot", "mma", "mma_ring") else x8[:1]
        _check(f"{fmt} {name} {tiles}", quant_linear(x, qw, route="gemv", tiles=tiles), x, qw, assert_close)
    split4 = PackedTiles(16, 1, 4, 4, "dot")
    _check(f"{fmt} {split4}", quant_linear(x8, qw, route="gemv", tiles=split4), x8, qw, assert_close)


@pytest.mark.parametrize("fmt", [Q4, Q5, Q6, W8])
def test_pairs_mode(fmt, device, assert_close):
    """The "pairs" tiles (on a GPU the Gluon kernel of gluon_gemv.py; the interpreter has no Gluon and runs the
    Triton CUDA-core mode): split and unsplit K, odd N, a row view of a fused parent, x a column slice."""
    from kernels.quant.gluon_gemv import HAS_GLUON

    assert HAS_GLUON or device == "cpu", "the GPU's Triton has no Gluon: the pairs tiles would not run it"
    for n, k, variant in (
        (37, 128, "pairs"),
        (300, 1024, "pairs"),
        (20, 2048, "pairs_n64s2"),
        (300, 768, "pairs_n32"),
        (50, 1024, "pairs_n32w2s2"),
        (70, 512, "pairs_n32w2"),
    ):
        qw = _weight(fmt, n, k, device)
        x = torch.randn(1, k + 8, device=device).bfloat16()[:, 4 : 4 + k]
        tiles = packed_tiles(fmt, n, k, variant)
        _check(f"{fmt} {n}x{k} {tiles}", quant_linear(x, qw, route="gemv", tiles=tiles), x, qw, assert_close)
    _check_row_view(fmt, "pairs", device, assert_close)


@pytest.mark.parametrize("fmt", [Q4, Q5, Q6, W8])
def test_ring_mode(fmt, device, assert_close):
    """The "ring" tiles (on a GPU the cp.async ring kernels, _quant_gemv_ring_kernel and W8's
    _quant_gemv_w8_ring_kernel; the interpreter runs the Triton CUDA-core mode): fewer stages than slots (one unit,
    empty copy groups), exactly as many, several passes of the ring with a last partial pass, split K, one and two
    units a slot, N below a tile and odd (the clamped rows), a row view of a fused parent, x a column slice; on the
    GPU each is bitwise the pairs kernel (W8: its Gluon pairs kernel; the same arithmetic in the same order)."""
    from kernels.quant.gluon_gemv import HAS_GLUON

    assert HAS_GLUON or device == "cpu", "the GPU's Triton has no Gluon: the ring tiles would not run it"
    for n, k, variant in (
        (37, 128, "ring_n64s1"),
        (300, 512, "ring_n64s1"),
        (300, 1280, "ring_n64s1"),
        (70, 2560, "ring_n64s2"),
        (20, 2048, "ring_n64s2st3"),
        (300, 1024, "ring_n32w2s2"),
        (200, 1280, "ring_n128s1"),
        (300, 2048, "ring_n32s2"),
    ):
        qw = _weight(fmt, n, k, device)
        x = torch.randn(1, k + 8, device=device).bfloat16()[:, 4 : 4 + k]
        tiles = packed_tiles(fmt, n, k, variant)
        assert tiles.mode == "ring", tiles
        got = quant_linear(x, qw, route="gemv", tiles=tiles)
        _check(f"{fmt} {n}x{k} {tiles}", got, x, qw, assert_close)
        if device != "cpu":
            pairs = tiles._replace(mode="pairs", num_stages=1)
            assert torch.equal(got, quant_linear(x, qw, route="gemv", tiles=pairs)), f"{fmt} {n}x{k} {tiles}"
    _check_row_view(fmt, "ring_n64s1", device, assert_close)


@pytest.mark.parametrize("fmt", [Q4, Q5, Q6])
def test_mma_mode(fmt, device, assert_close):
    """The "mma" tiles (on a GPU the tensor-core Gluon kernel, _quant_gemv_mma_kernel, for 1..8 rows of x; the
    interpreter runs the Triton modes): split and unsplit K, two-unit steps, N below one tile and not a multiple
    of it (the clamped rows), several tiles a thread, a row view of a fused parent, x a column slice, 1, 3 and 8
    rows, each row of a batch bitwise the row alone (on the GPU: one kernel for every T)."""
    from kernels.quant.gluon_gemv import HAS_GLUON

    assert HAS_GLUON or device == "cpu", "the GPU's Triton has no Gluon: the mma tiles would not run it"
    for n, k, variant in (
        (37, 128, "mma_n64"),
        (300, 1024, "mma_n64"),
        (20, 2048, "mma_n64s2"),
        (300, 768, "mma_n128"),
        (200, 1024, "mma_n128s2"),
        (50, 1024, "mma_n32w2s2"),
        (70, 512, "mma_n32w2"),
        (130, 640, "mma_n128w8"),
    ):
        _check_tensor_core_rows(fmt, n, k, variant, device, assert_close)
    _check_row_view(fmt, "mma_n64", device, assert_close, scale=30.0)  # large x: the fp32 accumulation holds


@pytest.mark.parametrize("fmt", [Q4, Q6, W8])
def test_ring_last_split_reduces(fmt, device, assert_close, monkeypatch):
    """NINFER_SPLITK_REDUCE=last on the ring kernels: no reduce launch, the same bits as the reduce launch's (the
    last split of each row tile sums the fp32 partials in split order), every ticket counter back at zero, launch
    after launch (on the GPU 50 in a row, the splits racing for their tickets). The interpreter runs the Triton
    modes and the reduce launch (no ring kernel there): the reference check alone."""
    import importlib

    import kernels._dispatch
    from kernels.linear import ticket_counters

    n, k, variant = 300, 2048, "ring_n32s2"
    qw = _weight(fmt, n, k, device)
    tiles = packed_tiles(fmt, n, k, variant)
    assert tiles.mode == "ring" and tiles.split_k > 1, tiles
    module = importlib.import_module("kernels.quant.packed_linear")
    for i in range(50 if device == "cuda" else 2):
        x = torch.randn(1, k, device=device).bfloat16()
        monkeypatch.setattr(kernels._dispatch, "SPLITK_REDUCE", "launch")
        expected = quant_linear(x, qw, route="gemv", tiles=tiles)
        monkeypatch.setattr(kernels._dispatch, "SPLITK_REDUCE", "last")
        if device == "cuda":
            monkeypatch.setattr(module, "_linear_reduce_kernel", None)  # a reduce launch would fail
        got = quant_linear(x, qw, route="gemv", tiles=tiles)
        monkeypatch.undo()
        _check(f"{fmt} {tiles} launch {i}", got, x, qw, assert_close)
        if device == "cuda":
            assert torch.equal(got, expected), f"{fmt} {tiles} launch {i}: not the reduce launch's bits"
    if device == "cuda":
        assert not bool(ticket_counters(x.device).any()), "a counter was left non-zero"


@pytest.mark.parametrize("fmt", [Q4, Q5, Q6])
def test_mma_ring_mode(fmt, device, assert_close):
    """The "mma_ring" tiles (on a GPU _quant_gemv_mma_ring_kernel: the tensor-core kernel's arithmetic, its weight
    bytes through the cp.async ring; the interpreter runs the Triton modes): fewer stages than slots, several
    passes with a partial last one, split K, N below a tile, 1 / 3 / 8 rows of x; on the GPU bitwise the "mma"
    kernel on the same tiles, each row of a batch bitwise the row alone, and with NINFER_SPLITK_REDUCE=last (the
    last split sums the partials, no reduce launch) the same bits."""
    from kernels.quant.gluon_gemv import HAS_GLUON

    assert HAS_GLUON or device == "cpu", "the GPU's Triton has no Gluon: the ring tiles would not run it"
    for n, k, variant in (
        (37, 256, "mmaring_n64s2"),
        (300, 1280, "mmaring_n64s2"),
        (20, 2048, "mmaring_n32w2s2"),
        (200, 1280, "mmaring_n128s1"),
    ):
        _check_tensor_core_rows(fmt, n, k, variant, device, assert_close)


@pytest.mark.parametrize("fmt", [Q4, Q6, W8])
def test_fp16_activations(fmt, device, assert_close):
    n, k = 37, 258
    qw = _weight(fmt, n, k, device)
    x = torch.randn(3, k, device=device).half()
    _check(f"{fmt} fp16", quant_linear(x, qw), x, qw, assert_close)


@pytest.mark.parametrize("fmt", FORMATS)
def test_row_views_and_strided_x(fmt, device, assert_close):
    """A row range of a fused parent (plane views, no copy) and x as a column slice of a wider tensor."""
    n, k, cut = 300, 192, (100, 150)
    part = _weight(fmt, n, k, device).rows(*cut)
    x = torch.randn(4, k + 40, device=device).bfloat16()[:, 8 : 8 + k]
    _check(f"{fmt} rows {cut}", quant_linear(x, part), x, part, assert_close)
    xs = torch.randn(20, k + 40, device=device).bfloat16()[:, 3 : 3 + k]
    _check(f"{fmt} rows {cut} prefill", quant_linear(xs, part), xs, part, assert_close)


@pytest.mark.parametrize("fmt", FORMATS)
def test_batch_invariance(fmt, device):
    n, k = 20, 1024
    qw = _weight(fmt, n, k, device)
    assert packed_tiles(fmt, n, k).split_k > 1
    x = torch.randn(8, k, device=device).bfloat16()
    full = quant_linear(x, qw)
    for i in range(7):  # 2..8 rows share their tiles; one row runs the one-row kernel (test_pairs_mode)
        assert torch.equal(quant_linear(x[i : i + 2], qw)[0], full[i]), f"{fmt} row {i}: T=2 differs from T=8"


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_to(fmt, device):
    """The layout's dequantize kernel is the exact weight rounded once to bf16 (bitwise on a GPU; Triton 3.6's
    interpreter truncates fp32 -> bf16: within one bf16 ulp there)."""
    from kernels.quant.quant_linear import dequantize_to

    qw = _weight(fmt, 37, 130, device)
    got = dequantize_to(qw, torch.bfloat16)
    exact = dequantize(qw)
    if device == "cuda":
        assert torch.equal(got, exact.to(torch.bfloat16))
    else:
        assert ((got.double() - exact.double()).abs() <= exact.double().abs() * 2.0**-7).all()


def test_real_geometry_rows(device, assert_close):
    """A 27B-shaped weight's slice (K = 5120 and 17408: 40 and 136 units, the tiles' splits) at T = 1, 8."""
    for fmt, n, k in ((Q4, 128, 5120), (Q5, 64, 17408)):
        qw = _weight(fmt, n, k, device)
        for rows in (1, 8):
            x = torch.randn(rows, k, device=device).bfloat16()
            _check(f"{fmt} {n}x{k} T={rows}", quant_linear(x, qw), x, qw, assert_close)
