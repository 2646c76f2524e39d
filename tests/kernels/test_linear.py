"""The linear reference against F.linear and float64, the launcher's dispatch (F.linear off CUDA, for more than
GEMV_MAX_ROWS rows and under NINFER_GEMV=off), its asserts, and the tile chooser (CPU only)."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

import kernels._dispatch
from kernels.linear import GEMV_FASTER, GEMV_MAX_ROWS, MIN_PROGRAMS, gemv_tiles, linear, linear_ref, use_gemv


@pytest.mark.parametrize(("rows", "n", "k"), [(1, 37, 60), (3, 1000, 200), (8, 64, 513), (20, 7, 5)])
def test_fp32_reference_is_f_linear(rows, n, k, assert_close):
    x, w = torch.randn(rows, k), torch.randn(n, k)
    out = linear_ref(x, w)
    assert out.shape == (rows, n) and out.dtype == torch.float32
    assert_close("linear_ref fp32", out, F.linear(x, w), 1e-6, 1e-5)
    exact = x.double() @ w.double().t()
    assert_close("linear_ref vs float64", out, exact, 1e-6, 1e-5)


def test_bf16_reference_rounds_the_fp32_product_once():
    x = torch.randn(4, 300).bfloat16()
    w = torch.randn(50, 300).bfloat16()
    out = linear_ref(x, w)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, (x.float() @ w.float().t()).bfloat16())
    exact = x.double() @ w.double().t()
    # one rounding of a product accurate to fp32: within half a bf16 ulp (2^-8 relative) plus the fp32 sum
    bound = exact.abs() * 2.0**-8 + (x.double().abs() @ w.double().abs().t()) * 1e-6
    assert ((out.double() - exact).abs() <= bound).all()


@pytest.fixture
def no_interpreter(monkeypatch):
    """The interpreter venv would run the Triton kernel on CPU tensors; these tests check the CPU dispatch."""
    monkeypatch.setattr(kernels._dispatch, "INTERPRET", False)


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 9, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_launcher_off_cuda_is_f_linear(rows, dtype, no_interpreter):
    x, w = torch.randn(rows, 96, dtype=dtype), torch.randn(40, 96, dtype=dtype)
    assert not use_gemv(x, w)
    assert torch.equal(linear(x, w), F.linear(x, w))


def test_strided_rows_off_cuda(no_interpreter):
    """x as a column slice of a wider tensor (row stride > K), as a fused projection's output view."""
    base = torch.randn(5, 130)
    x = base[:, 10:110]
    assert x.stride() == (130, 1)
    w = torch.randn(33, 100)
    assert torch.equal(linear(x, w), F.linear(x, w))


def test_dispatch_rules(monkeypatch):
    """The GEMV runs only where Triton runs, at most GEMV_MAX_ROWS rows, and not under NINFER_GEMV=off."""
    monkeypatch.setattr(kernels._dispatch, "HAS_TRITON", True)
    monkeypatch.setattr(kernels._dispatch, "INTERPRET", True)  # stands in for CUDA tensors
    monkeypatch.setattr(kernels._dispatch, "KERNELS_MODE", "auto")
    monkeypatch.setattr(kernels._dispatch, "GEMV_MODE", "auto")
    w = torch.randn(16, 32)
    assert use_gemv(torch.randn(1, 32), w) and use_gemv(torch.randn(GEMV_MAX_ROWS, 32), w)
    assert not use_gemv(torch.randn(GEMV_MAX_ROWS + 1, 32), w)
    monkeypatch.setattr(kernels._dispatch, "GEMV_MODE", "off")
    assert not use_gemv(torch.randn(1, 32), w)
    monkeypatch.setattr(kernels._dispatch, "GEMV_MODE", "auto")
    monkeypatch.setattr(kernels._dispatch, "KERNELS_MODE", "ref")
    assert not use_gemv(torch.randn(1, 32), w)
    monkeypatch.setattr(kernels._dispatch, "KERNELS_MODE", "auto")
    monkeypatch.setattr(kernels._dispatch, "INTERPRET", False)
    assert not use_gemv(torch.randn(1, 32), w)  # CPU tensors without the interpreter


def test_auto_takes_the_gemv_only_on_shapes_measured_faster(monkeypatch):
    """NINFER_GEMV=auto on a GPU: the GEMV for the weight shapes GEMV_FASTER lists for the device's compute
    capability, cuBLAS for the others and on GPUs with no measurements; `on` takes it everywhere."""
    monkeypatch.setattr(kernels._dispatch, "HAS_TRITON", True)
    monkeypatch.setattr(kernels._dispatch, "KERNELS_MODE", "auto")
    monkeypatch.setattr(kernels._dispatch, "INTERPRET", False)
    module = importlib.import_module("kernels.linear")  # the attribute kernels.linear is the launcher
    monkeypatch.setattr(module, "use_triton", lambda *tensors: True)  # stands in for CUDA tensors
    x = torch.empty(1, 2048, device="meta")
    faster, slower = torch.empty(12352, 2048, device="meta"), torch.empty(9216, 2048, device="meta")
    assert (12352, 2048) in GEMV_FASTER[(9, 0)] and (9216, 2048) not in GEMV_FASTER[(9, 0)]
    for mode, capability, expected in (("auto", (9, 0), (True, False)), ("auto", (12, 0), (False, False)),
                                       ("on", (12, 0), (True, True)), ("off", (9, 0), (False, False))):  # fmt: skip
        monkeypatch.setattr(kernels._dispatch, "GEMV_MODE", mode)
        monkeypatch.setattr(module, "_capability", lambda device, c=capability: c)
        assert (use_gemv(x, faster), use_gemv(x, slower)) == expected, (mode, capability)
    assert not use_gemv(torch.empty(GEMV_MAX_ROWS + 1, 2048, device="meta"), faster)  # prefill: F.linear


def test_gemv_mode_parsing():
    assert kernels._dispatch.parse_gemv_mode("auto") == "auto"
    assert kernels._dispatch.parse_gemv_mode(" OFF ") == "off"
    assert kernels._dispatch.parse_gemv_mode("on") == "on"
    with pytest.raises(ValueError, match="NINFER_GEMV"):
        kernels._dispatch.parse_gemv_mode("triton")


def test_asserts(no_interpreter):
    w = torch.randn(8, 16)
    with pytest.raises(AssertionError, match="2-D"):
        linear(torch.randn(2, 3, 16), w)
    with pytest.raises(AssertionError, match="K differs"):
        linear(torch.randn(2, 15), w)
    with pytest.raises(AssertionError, match="dtype|!="):
        linear(torch.randn(2, 16, dtype=torch.bfloat16), w)
    with pytest.raises(AssertionError, match="unit stride"):
        linear(torch.randn(16, 2).t(), w)
    with pytest.raises(AssertionError, match="not contiguous"):
        linear(torch.randn(2, 16), torch.randn(16, 8).t())


# (N, K): the real decode shapes (27B: qkv, o_proj / GDN out_proj, GDN in_proj, gate_up, down, lm_head;
# 35B-A3B: qkv, o_proj / out_proj, in_proj, router, lm_head) and odd ones
SHAPES = [(14336, 5120), (5120, 6144), (16480, 5120), (34816, 5120), (5120, 17408), (248320, 5120),
          (9216, 2048), (2048, 4096), (12352, 2048), (256, 2048), (248320, 2048), (37, 60), (1000, 200), (1, 7)]  # fmt: skip


@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_tiles_are_valid(n, k, dtype):
    """Power-of-2 blocks of at least 16 (a tensor-core dot), at most 512 bytes of columns a step, and a split
    only into whole steps, and only while the weight-row tiles give fewer than MIN_PROGRAMS programs."""
    tiles = gemv_tiles(n, k, dtype)
    for block in (tiles.block_n, tiles.block_k):
        assert block >= 16 and block & (block - 1) == 0, tiles
    assert tiles.block_k * dtype.itemsize <= 512
    assert tiles.split_k == 1 or k % (tiles.split_k * tiles.block_k) == 0
    tiles_n = -(-n // tiles.block_n)
    if tiles.split_k > 1:
        assert tiles_n * tiles.split_k // 2 < MIN_PROGRAMS


def test_tiles_at_the_real_geometries():
    """What the docstring of gemv_tiles promises: no 27B shape is split; the 35B-A3B o_proj in 2, router in 8."""
    for n, k in SHAPES[:6]:
        assert gemv_tiles(n, k, torch.bfloat16).split_k == 1, (n, k)
    assert gemv_tiles(2048, 4096, torch.bfloat16).split_k == 2
    assert gemv_tiles(256, 2048, torch.bfloat16).split_k == 8
    assert gemv_tiles(5120, 6144, torch.bfloat16) == (32, 256, 4, 1, 4)
