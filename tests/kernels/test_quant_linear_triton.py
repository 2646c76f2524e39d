"""Triton quantized GEMV and GEMM vs ``quant_linear_ref`` for every format: T = 1..8 and prefill sizes, odd N
and K (row-split K padding), split K, row views of a fused parent, strided x, bitwise batch invariance of the
GEMV, the FP8 scaled_mm route (GPU) and CUDA-graph replay (GPU). Under TRITON_INTERPRET=1 on the CPU too."""

from __future__ import annotations

import pytest
import torch

from kernels.quant import (
    FP8,
    NVFP4,
    Q4,
    Q5,
    Q6,
    W8,
    encode,
    gemm_tiles,
    gemv_tiles,
    quant_linear,
    quant_linear_ref,
    view_planes,
)

# NOTE: interpreter_fixes (conftest.py): Triton 3.6's interpreter multiplies bf16 dot operands as raw integers
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("interpreter_fixes")]

FORMATS = [Q4, Q5, Q6, W8, NVFP4, FP8]
# rel RMS against the reference: bf16 output rounding (the interpreter truncates: ~4e-3) and fp32 summation
# order; the GEMM of the groupwise formats also rounds each dequantized weight to bf16 (2^-9 relative)
RMS = {"gemv": 6e-3, "gemm": 8e-3}
# per element, relative to sum |x_k w_k|: the output rounding of the largest outputs plus the weight rounding
ELEMENT = {"gemv": 2.0**-7, "gemm": 2.0**-7 + 2.0**-8}


def _weight(fmt: str, n: int, k: int, device: str):
    payload = encode(fmt, torch.randn(n, k) * k**-0.5)
    return view_planes(fmt, payload.to(device), (n, k))


def _check(name, got, x, qw, route, assert_close):
    expected = quant_linear_ref(x, qw)
    assert got.dtype == x.dtype and got.shape == expected.shape, name
    assert_close(name, got, expected, RMS[route], 0.0)
    from kernels.quant import dequantize

    magnitude = x.double().abs() @ dequantize(qw).double().abs().t()
    worst = ((got.double() - expected.double()).abs() / (magnitude * ELEMENT[route] + 1e-30)).max().item()
    assert worst <= 1.0, f"{name}: an element is {worst:.2f}x past its bound"


SHAPES = {fmt: [(37, 130), (64, 320), (32, 1024)] for fmt in (Q4, Q5, Q6, W8, FP8)}
SHAPES[NVFP4] = [(128, 64), (128, 320), (256, 1024)]


@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("fmt", FORMATS)
def test_gemv(fmt, rows, device, assert_close):
    for n, k in SHAPES[fmt]:
        qw = _weight(fmt, n, k, device)
        x = torch.randn(rows, k, device=device).bfloat16()
        tiles = gemv_tiles(fmt, n, k)
        _check(f"{fmt} T={rows} {n}x{k} {tiles}", quant_linear(x, qw), x, qw, "gemv", assert_close)


@pytest.mark.parametrize("rows", [9, 40])
@pytest.mark.parametrize("fmt", FORMATS)
def test_gemm(fmt, rows, device, assert_close):
    for n, k in SHAPES[fmt][:2]:
        qw = _weight(fmt, n, k, device)
        x = torch.randn(rows, k, device=device).bfloat16()
        tiles = gemm_tiles(fmt, n, k, rows)
        _check(
            f"{fmt} T={rows} {n}x{k} {tiles}", quant_linear(x, qw, route="gemm"), x, qw, "gemm", assert_close
        )


@pytest.mark.parametrize("fmt", [Q5, NVFP4, FP8])
def test_row_views_and_strided_x(fmt, device, assert_close):
    """A row range of a fused parent (plane views, no copy) and x as a column slice of a wider tensor."""
    n, k, cut = (384, 128, (128, 256)) if fmt == NVFP4 else (300, 192, (100, 150))
    part = _weight(fmt, n, k, device).rows(*cut)
    base = torch.randn(4, k + 40, device=device).bfloat16()
    x = base[:, 8 : 8 + k]
    _check(f"{fmt} rows {cut}", quant_linear(x, part), x, part, "gemv", assert_close)
    xs = torch.randn(20, k + 40, device=device).bfloat16()[:, 3 : 3 + k]
    _check(f"{fmt} rows {cut} gemm", quant_linear(xs, part, route="gemm"), xs, part, "gemm", assert_close)


@pytest.mark.parametrize("fmt", FORMATS)
def test_gemv_batch_invariance(fmt, device):
    n, k = SHAPES[fmt][-1]  # the split-K shape
    qw = _weight(fmt, n, k, device)
    x = torch.randn(8, k, device=device).bfloat16()
    full = quant_linear(x, qw)
    # one bf16 row of FP8 rows / NVFP4 runs a Gluon one-row GEMV on a GPU (test_one_row_gemv): 2-row slices
    rows = 2 if fmt in (FP8, NVFP4) else 1
    for i in range(0, 8, rows):
        assert torch.equal(quant_linear(x[i : i + rows], qw), full[i : i + rows]), f"{fmt} rows {i}: T={rows}"


@pytest.mark.parametrize("fmt", [FP8, NVFP4])
@pytest.mark.parametrize(("n", "k", "cut"), [(37, 384, None), (384, 1024, (128, 256)), (5120, 6144, None)])
def test_one_row_gemv(fmt, n, k, cut, device, assert_close):
    """One bf16 row of x on FP8 rows and NVFP4: on a GPU the Gluon one-row GEMVs (kernels/quant/gluon_gemv.py;
    the interpreter has no Gluon and runs the Triton GEMV): odd N, a row view of a fused parent (NVFP4's on a
    128-row tile), x a column slice, the 27B attention output's shape (split K)."""
    from kernels.quant.quant_linear import one_row_ok, one_row_tiles

    n = -(-n // 128) * 128 if fmt == NVFP4 else n  # NVFP4's scale tiles: N a multiple of 128
    qw = _weight(fmt, n, k, device)
    part = qw if cut is None else qw.rows(*cut)
    x = torch.randn(1, k + 8, device=device).bfloat16()[:, 4 : 4 + k]
    assert one_row_ok(x, part) == (device == "cuda"), "the one-row kernel runs on every GPU with Gluon"
    _check(f"{fmt} one row {part.shape}", quant_linear(x, part), x, part, "gemv", assert_close)
    if device == "cuda":
        # both builds (NINFER_FP_ONE_ROW): the register prefetch and the cp.async ring, the same arithmetic in
        # the same order on the same split: bitwise equal
        pn, pk = part.shape
        rows, ring = (one_row_tiles(fmt, pn, pk, mode) for mode in ("rows", "ring"))
        assert ring.mode == "ring" and ring.num_stages >= 2, ring
        ring_out = quant_linear(x, part, route="gemv", tiles=ring)
        _check(f"{fmt} one row ring {part.shape}", ring_out, x, part, "gemv", assert_close)
        same_split = quant_linear(x, part, route="gemv", tiles=rows._replace(split_k=ring.split_k))
        assert torch.equal(ring_out, same_split), f"{fmt} {part.shape}: ring differs from rows on {ring}"
        if ring.split_k > 1:  # NINFER_SPLITK_REDUCE=last: the ring's last split sums the partials, same bits
            import kernels._dispatch
            from kernels.linear import ticket_counters

            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(kernels._dispatch, "SPLITK_REDUCE", "last")
                last_out = quant_linear(x, part, route="gemv", tiles=ring)
            assert torch.equal(last_out, ring_out), f"{fmt} {part.shape}: the last split's sum differs"
            assert not bool(ticket_counters(x.device).any()), "a counter was left non-zero"


def test_fp8_scaled_mm_route(device, assert_close):
    """W8A8 on the FP8 tensor cores: x's per-row E4M3 quantization adds up to 2^-4 relative per element."""
    if device != "cuda":
        pytest.skip("torch._scaled_mm needs a GPU with FP8 tensor cores")
    qw = _weight(FP8, 5120, 6144, device)
    x = torch.randn(300, 6144, device=device).bfloat16()
    assert_close("scaled_mm", quant_linear(x, qw), quant_linear_ref(x, qw), 4e-2, 0.0)


def test_cuda_graph_replay(device):
    if device != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    for fmt in FORMATS:
        qw = _weight(fmt, 5120 if fmt != NVFP4 else 5120, 2048, device)
        x = torch.randn(8, 2048, device=device).bfloat16()
        expected = quant_linear(x, qw)
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            quant_linear(x, qw)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = quant_linear(x, qw)
        x.copy_(x.flip(0))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected.flip(0)), f"{fmt}: the replay differs"


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_to(fmt, device):
    """The Triton dequantization is the exact weight rounded once to bf16 (bitwise on a GPU; Triton 3.6's
    interpreter truncates fp32 -> bf16: within one bf16 ulp there)."""
    from kernels.quant import dequantize
    from kernels.quant.quant_linear import dequantize_to

    n, k = (256, 320) if fmt == NVFP4 else (37, 130)
    qw = _weight(fmt, n, k, device)
    got = dequantize_to(qw, torch.bfloat16)
    exact = dequantize(qw)
    if device == "cuda":
        assert torch.equal(got, exact.to(torch.bfloat16))
    else:
        assert ((got.double() - exact.double()).abs() <= exact.double().abs() * 2.0**-7).all()


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequant_route_in_slabs(fmt, device, assert_close, monkeypatch):
    """route="dequant": 128-row slabs (the chunk forced small) dequantized and multiplied by torch.matmul."""
    import importlib

    # NOTE: the package attribute kernels.quant.quant_linear is the function; the module is in sys.modules
    monkeypatch.setattr(importlib.import_module("kernels.quant.quant_linear"), "DEQUANT_CHUNK_BYTES", 1)
    n, k = (384, 128) if fmt == NVFP4 else (300, 130)
    qw = _weight(fmt, n, k, device)
    x = torch.randn(20, k, device=device).bfloat16()
    _check(f"{fmt} dequant", quant_linear(x, qw, route="dequant"), x, qw, "gemm", assert_close)
