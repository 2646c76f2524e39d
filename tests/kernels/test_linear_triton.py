"""Triton GEMV ``linear`` vs its reference: bf16 and fp32, T = 1..8, odd N and K, strided x, other tiles and
split-K, bitwise batch invariance, and the F.linear fallback for more than 8 rows (GPU; or CPU under
TRITON_INTERPRET=1 for all but the largest real shapes)."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

import kernels._dispatch
from kernels.linear import GemvTiles, _launch_linear, gemv_tiles, linear, linear_ref, ticket_counters

# NOTE: interpreter_fixes (conftest.py): Triton 3.6's interpreter multiplies bf16 dot operands as raw integers
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("interpreter_fixes")]

# rel RMS: bf16 output, both sides fp32 sums rounded once: on the GPU they differ where the two fp32 values
# straddle a rounding boundary (rel RMS ~1e-3); Triton 3.6's interpreter truncates fp32 -> bf16 (~4e-3).
# fp32: the summation order only.
RMS_RATIO = {torch.bfloat16: 6e-3, torch.float16: 2e-3, torch.float32: 1e-5}
# per element: one output rounding (truncation under the interpreter: < 1 ulp = 2^-7 relative for bf16, plus
# the reference's own half ulp), plus the fp32 summation-order difference, relative to sum |x_k w_k|
ELEMENT_RTOL = {torch.bfloat16: 2.0**-7 + 2.0**-8, torch.float16: 2.0**-10 + 2.0**-11, torch.float32: 1e-6}
SUM_RTOL = 2e-5


@pytest.fixture(autouse=True)
def _gemv_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """``linear`` runs the GEMV on every shape here (NINFER_GEMV=on): under the default ``auto`` a GPU sends
    the shapes it has not measured faster to cuBLAS (kernels.linear.GEMV_FASTER), which would test cuBLAS."""
    monkeypatch.setattr(kernels._dispatch, "GEMV_MODE", "on")


def _check(name: str, actual: torch.Tensor, x: torch.Tensor, w: torch.Tensor, assert_close) -> None:
    expected = linear_ref(x, w)
    assert actual.dtype == expected.dtype == x.dtype, f"{name}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert_close(name, actual, expected, RMS_RATIO[x.dtype], 0.0)
    err = (actual.double() - expected.double()).abs()
    magnitude = x.double().abs() @ w.double().abs().t()
    bound = expected.double().abs() * ELEMENT_RTOL[x.dtype] + magnitude * SUM_RTOL + 1e-30
    worst = (err / bound).max().item() if err.numel() else 0.0
    assert worst <= 1.0, f"{name}: an element is {worst:.2f}x past its bound"


def _weights(n: int, k: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    return (torch.randn(n, k, device=device) * k**-0.5).to(dtype)


@pytest.mark.parametrize("rows", [1, 2, 3, 8])
@pytest.mark.parametrize(("n", "k"), [(37, 60), (1000, 200), (37, 200), (64, 2048), (300, 1100)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_linear_matches_reference(rows, n, k, dtype, device, assert_close):
    x = torch.randn(rows, k, device=device).to(dtype)
    w = _weights(n, k, dtype, device)
    _check(f"T={rows} N={n} K={k}", linear(x, w), x, w, assert_close)


def test_fp16(device, assert_close):
    x = torch.randn(3, 640, device=device).half()
    w = _weights(100, 640, torch.float16, device)
    _check("fp16", linear(x, w), x, w, assert_close)


# the real decode shapes: 27B o_proj / GDN out_proj [5120, 6144] (the interpreter's largest), qkv,
# MLP down; 35B-A3B o_proj [2048, 4096] (split-K), router [256, 2048] (split-K)
REAL = [(5120, 6144), (2048, 4096), (256, 2048), (14336, 5120), (5120, 17408)]


@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize(("n", "k"), REAL)
def test_real_shapes(rows, n, k, device, assert_close):
    if device == "cpu" and n * k > 5120 * 6144:
        pytest.skip("the interpreter runs [5120, 6144] and smaller only (it is slow on the CPU)")
    x = torch.randn(rows, k, device=device).bfloat16()
    w = _weights(n, k, torch.bfloat16, device)
    _check(f"T={rows} {n}x{k} {gemv_tiles(n, k, torch.bfloat16)}", linear(x, w), x, w, assert_close)


@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_strided_x(rows, dtype, device, assert_close):
    """x as a column slice of a wider tensor: row stride 600 (16-byte aligned) and 517 (not even 4-byte
    aligned in bf16), as the fused projections' outputs are split into views."""
    for width, start in ((600, 40), (517, 3)):
        base = torch.randn(rows, width, device=device).to(dtype)
        x = base[:, start : start + 480]
        assert x.stride() == (width, 1)
        w = _weights(77, 480, dtype, device)
        _check(f"row stride {width}", linear(x, w), x, w, assert_close)


# tiles the H200 sweep in bench/kernels/hot_path.py tries (the defaults run above), split-K among them
OTHER_TILES = [GemvTiles(16, 256, 4, 1, 4), GemvTiles(64, 128, 4, 1, 4), GemvTiles(32, 512, 4, 1, 3),
               GemvTiles(128, 128, 8, 1, 3), GemvTiles(32, 256, 4, 2, 4), GemvTiles(32, 128, 4, 4, 6),
               GemvTiles(32, 256, 4, 1, 1), GemvTiles(16, 64, 2, 1, 2)]  # fmt: skip


@pytest.mark.parametrize("tiles", OTHER_TILES)
@pytest.mark.parametrize("rows", [1, 5])
def test_other_tiles(tiles, rows, device, assert_close):
    x = torch.randn(rows, 2048, device=device).bfloat16()
    w = _weights(200, 2048, torch.bfloat16, device)
    _check(f"tiles {tiles}", _launch_linear(x, w, tiles), x, w, assert_close)


@pytest.mark.parametrize(("n", "k"), [(300, 1100), (512, 2048), (37, 60), (5120, 6144), (2048, 4096)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_batch_invariance(n, k, dtype, device):
    """Every row of a T=8 call (and of a T=3 call) is bitwise the row run alone ([512, 2048] and [2048, 4096]
    split K: the partials and their fixed-order reduction are batch invariant too)."""
    if device == "cpu" and n * k > 512 * 2048:
        pytest.skip("real-geometry size: GPU only (the interpreter is slow on the CPU)")
    assert (gemv_tiles(n, k, dtype).split_k > 1) == ((n, k) in ((512, 2048), (2048, 4096)))
    x = torch.randn(8, k, device=device).to(dtype)
    w = _weights(n, k, dtype, device)
    full = linear(x, w)
    three = linear(x[2:5], w)
    for i in range(8):
        alone = linear(x[i : i + 1], w)
        assert torch.equal(alone[0], full[i]), f"row {i}: T=1 differs from T=8"
    for i in range(3):
        assert torch.equal(three[i], full[2 + i]), f"row {2 + i}: T=3 differs from T=8"


# split-K launches: other tiles (N not a multiple of BLOCK_N: a partial last row tile), the 35B-A3B router's
# default split in 8 ([256, 2048]) and [512, 2048]'s
LAST_REDUCES = [(200, 2048, GemvTiles(32, 256, 4, 2, 4)), (37, 1024, GemvTiles(16, 128, 4, 4, 6)),
                (256, 2048, None), (512, 2048, None)]  # fmt: skip


@pytest.mark.parametrize(("n", "k", "tiles"), LAST_REDUCES)
@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_last_split_reduces_bitwise_the_reduce_launch(n, k, tiles, rows, dtype, device, monkeypatch):
    """NINFER_SPLITK_REDUCE=last: no reduce launch, the same bits as the reduce kernel's, every row tile's
    counter back at zero."""
    tiles = tiles or gemv_tiles(n, k, dtype)
    assert tiles.split_k > 1
    x = torch.randn(rows, k, device=device).to(dtype)
    w = _weights(n, k, dtype, device)
    expected = _launch_linear(x, w, tiles)
    monkeypatch.setattr(kernels._dispatch, "SPLITK_REDUCE", "last")
    module = importlib.import_module("kernels.linear")  # (kernels.linear is the function the package exports)
    monkeypatch.setattr(module, "_linear_reduce_kernel", None)  # a reduce launch would fail
    assert torch.equal(_launch_linear(x, w, tiles), expected)
    assert not bool(ticket_counters(x.device).any()), "a counter was left non-zero"
    alone = _launch_linear(x[-1:], w, tiles)
    assert torch.equal(alone[0], expected[-1]), "batch invariance"


def test_last_split_reduces_launch_after_launch(device, monkeypatch):
    """Many launches in a row, new inputs each (on the GPU, 200 at the 35B-A3B o_proj and router shapes, the
    splits racing for their tickets): every output is the reduce launch's, every counter back at zero."""
    shapes, launches = ([(2048, 4096), (256, 2048)], 200) if device == "cuda" else ([(200, 2048)], 3)
    for n, k in shapes:
        tiles = gemv_tiles(n, k, torch.bfloat16)
        if device != "cuda":
            tiles = GemvTiles(32, 256, 4, 2, 4)
        w = _weights(n, k, torch.bfloat16, device)
        for i in range(launches):
            x = torch.randn(1 + i % 8, k, device=device).bfloat16()
            monkeypatch.setattr(kernels._dispatch, "SPLITK_REDUCE", "launch")
            expected = _launch_linear(x, w, tiles)
            monkeypatch.setattr(kernels._dispatch, "SPLITK_REDUCE", "last")
            assert torch.equal(_launch_linear(x, w, tiles), expected), f"{n}x{k} launch {i}"
        assert not bool(ticket_counters(w.device).any()), "a counter was left non-zero"


def test_more_than_eight_rows_is_f_linear(device):
    for rows in (9, 64):
        x = torch.randn(rows, 256, device=device).bfloat16()
        w = _weights(40, 256, torch.bfloat16, device)
        assert torch.equal(linear(x, w), F.linear(x, w))


def test_empty_and_single_column(device, assert_close):
    w = _weights(0, 64, torch.bfloat16, device)
    assert linear(torch.randn(2, 64, device=device).bfloat16(), w).shape == (2, 0)
    x = torch.randn(4, 1, device=device)
    w1 = torch.randn(9, 1, device=device)
    _check("K=1", linear(x, w1), x, w1, assert_close)


def test_cuda_graph_replay(device, monkeypatch):
    """The launch (split-K too: its fp32 partials come from the graph's pool; with its reduce launch and with
    the last split reducing) replays in a CUDA graph."""
    if device != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    for n, k, reduce in ((5120, 6144, "launch"), (2048, 4096, "launch"), (2048, 4096, "last")):
        monkeypatch.setattr(kernels._dispatch, "SPLITK_REDUCE", reduce)
        x = torch.randn(8, k, device=device).bfloat16()
        w = _weights(n, k, torch.bfloat16, device)
        expected = linear(x, w)
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            linear(x, w)  # compile outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = linear(x, w)
        x.copy_(x.flip(0))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected.flip(0)), f"{n}x{k} {reduce}: the replay differs"
