"""The quantized linear layer's reference (CPU): ``quant_linear_ref`` is x @ the exact decoded weight^T in
float32 rounded once; ``quant_linear`` runs it where no kernel runs (the CPU, fp32 x), and refuses bad input."""

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
    decode_ref,
    encode,
    gemv_tiles,
    quant_linear,
    quant_linear_ref,
    view_planes,
)

FORMATS = [Q4, Q5, Q6, W8, NVFP4, FP8]


def _weight(fmt: str, n: int, k: int):
    payload = encode(fmt, torch.randn(n, k) * k**-0.5)
    return payload, view_planes(fmt, payload, (n, k))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_is_the_decoded_matmul(fmt, dtype):
    n, k = (128, 192) if fmt == NVFP4 else (37, 130)
    payload, qw = _weight(fmt, n, k)
    x = torch.randn(5, k).to(dtype)
    expected = (x.double() @ decode_ref(fmt, payload, (n, k)).double().t()).to(dtype)
    got = quant_linear_ref(x, qw)
    assert got.dtype == dtype and got.shape == (5, n)
    tol = 1e-5 if dtype == torch.float32 else 2.0**-8
    assert torch.allclose(got.double(), expected.double(), rtol=tol, atol=1e-6)


@pytest.mark.parametrize("fmt", FORMATS)
def test_cpu_launcher_runs_the_reference(fmt):
    n, k = (128, 64) if fmt == NVFP4 else (20, 64)
    _, qw = _weight(fmt, n, k)
    for rows in (1, 8, 12):
        x = torch.randn(rows, k).bfloat16()
        assert torch.equal(quant_linear(x, qw), quant_linear_ref(x, qw))


def test_bad_input():
    _, qw = _weight(Q4, 16, 64)
    with pytest.raises(AssertionError, match="K differs"):
        quant_linear(torch.randn(2, 65), qw)
    with pytest.raises(AssertionError, match="unit stride"):
        quant_linear(torch.randn(64, 2).t(), qw)


def test_gemv_tiles_split_k_until_enough_programs():
    """K is split (a whole number of steps a split) until the grid has MIN_PROGRAMS programs; T never enters."""
    from kernels.quant.quant_linear import MIN_PROGRAMS

    assert gemv_tiles(Q4, 32, 1024).split_k == 4 and gemv_tiles(W8, 32, 1024).split_k == 4
    assert gemv_tiles(NVFP4, 256, 1024).split_k == 4 and gemv_tiles(FP8, 32, 1024).split_k == 2
    # the 27B: MLP down [5120, 17408] (68 steps of 4 groups: 160 row tiles x 17), attention q/k [7168, 5120]
    # (20 steps: 224 x 5); MLP gate_up [34816, 5120] and the head have >= 1024 row tiles: unsplit
    assert gemv_tiles(Q5, 5120, 17408).split_k == 17 and gemv_tiles(Q4, 7168, 5120).split_k == 5
    assert gemv_tiles(Q4, 34816, 5120).split_k == 1 and gemv_tiles(Q6, 248320, 5120).split_k == 1
    for fmt, n, k in [(Q5, 5120, 6144), (Q4, 4096, 5120), (NVFP4, 5120, 6144), (FP8, 5120, 17408)]:
        tiles = gemv_tiles(fmt, n, k)
        assert (k + 127) // 128 * 128 % (tiles.split_k * tiles.block_k) == 0, (fmt, tiles)
        assert -(-n // tiles.block_n) * tiles.split_k >= MIN_PROGRAMS, (fmt, n, k, tiles)
