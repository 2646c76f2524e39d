"""Triton ``silu_mul`` and ``sigmoid_gate_mul`` vs their references (GPU; or CPU under TRITON_INTERPRET=1)."""

from __future__ import annotations

import pytest
import torch

from kernels.activation import (
    SigmoidGateMulTiles,
    SiluMulTiles,
    _launch_sigmoid_gate_mul,
    _launch_silu_mul,
    sigmoid_gate_mul,
    sigmoid_gate_mul_ref,
    silu_mul,
    silu_mul_ref,
)

pytestmark = pytest.mark.gpu

# Both sides compute in fp32 and round once: bf16 outputs differ by at most one output rounding (one ulp,
# <= 2^-7 relative) where the two fp32 values straddle a rounding boundary; fp32 outputs by the GPU's
# approximate exp and division (a few fp32 ulps). Every factor is a product or a sum of positives (no
# cancellation), so the bound holds per element, relative to the element; the absolute floor is the
# subnormal spacing of the 16-bit types, and fp32's smallest normal (the GPU may flush subnormals to zero).
ELEMENT_RTOL = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 1e-5}
ELEMENT_ATOL = {torch.bfloat16: 2.0**-133, torch.float16: 2.0**-24, torch.float32: 2.0**-126}
# rel RMS (reported first, for its message): for the 16-bit types the element bound caps it. On the GPU
# only the rare straddling elements differ; Triton's interpreter truncates on its casts to bf16, so there
# about half the elements are one ulp off (rel RMS ~4e-3), still within one rounding each.
RMS_RATIO = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 1e-6}


def _check(name: str, actual: torch.Tensor, expected: torch.Tensor, assert_close) -> None:
    assert actual.dtype == expected.dtype, f"{name}: dtype {actual.dtype} != {expected.dtype}"
    assert_close(name, actual, expected, RMS_RATIO[expected.dtype], 0.0)
    err = (actual.double() - expected.double()).abs()
    bound = expected.double().abs() * ELEMENT_RTOL[expected.dtype] + ELEMENT_ATOL[expected.dtype]
    worst = (err / bound).max().item() if err.numel() else 0.0
    assert worst <= 1.0, f"{name}: an element is {worst:.2f}x past one output rounding"


@pytest.mark.parametrize("shape", [(1, 17408), (3, 5), (8, 1000), (77, 512), (2, 5, 100), (300, 24)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_silu_mul(shape, dtype, device, assert_close):
    gate = torch.randn(shape, device=device, dtype=dtype) * 3
    up = torch.randn(shape, device=device, dtype=dtype)
    _check("silu_mul", silu_mul(gate, up), silu_mul_ref(gate, up), assert_close)


def test_silu_mul_fp16(device, assert_close):
    gate, up = (torch.randn(5, 300, device=device, dtype=torch.float16) for _ in range(2))
    _check("silu_mul fp16", silu_mul(gate, up), silu_mul_ref(gate, up), assert_close)


@pytest.mark.parametrize(("rows", "inter"), [(9, 384), (4, 17408), (6, 37)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_halves_of_one_tensor(rows, inter, dtype, device, assert_close):
    """gate and up as the two halves of one [T, 2I] tensor (row stride 2I, up's base I elements in)."""
    base = torch.randn(rows, 2 * inter, device=device, dtype=dtype) * 2
    gate, up = base.chunk(2, dim=-1)
    assert gate.stride() == (2 * inter, 1) and not gate.is_contiguous()
    _check("halves", silu_mul(gate, up), silu_mul_ref(gate, up), assert_close)


def test_halves_of_a_3d_tensor_and_mixed_layouts(device, assert_close):
    base = torch.randn(2, 7, 2 * 96, device=device, dtype=torch.bfloat16)
    gate, up = base.chunk(2, dim=-1)  # [2, 7, 96], strides (1344, 192, 1): a view as [14, 96]
    out = silu_mul(gate, up)
    assert out.shape == (2, 7, 96) and out.is_contiguous()
    _check("3d halves", out, silu_mul_ref(gate, up), assert_close)
    transposed = torch.randn(96, 14, device=device, dtype=torch.bfloat16).t()  # unit stride along rows
    up_plain = torch.randn(14, 96, device=device, dtype=torch.bfloat16)
    _check(
        "transposed gate", silu_mul(transposed, up_plain), silu_mul_ref(transposed, up_plain), assert_close
    )


@pytest.mark.parametrize(
    "tiles",
    [SiluMulTiles(1, 512, 4), SiluMulTiles(1, 2048, 8), SiluMulTiles(4, 1024, 8), SiluMulTiles(2, 64, 2)],
)
def test_other_tiles(tiles, device, assert_close):
    """The tile shapes the H200 sweep in bench/kernels/hot_path.py tries (the default one runs above)."""
    gate, up = (torch.randn(5, 1100, device=device, dtype=torch.bfloat16) for _ in range(2))
    _check(f"tiles {tiles}", _launch_silu_mul(gate, up, tiles), silu_mul_ref(gate, up), assert_close)


def test_empty(device):
    gate = torch.randn(0, 17408, device=device, dtype=torch.bfloat16)
    assert silu_mul(gate, gate).shape == (0, 17408)


def test_prefill_geometry(device, assert_close):
    """The 27B dense MLP at a 7,680-token prefill chunk (CUDA only: too slow for the interpreter)."""
    if device != "cuda":
        pytest.skip("7680 x 17408 runs on a real GPU only")
    gate, up = (torch.randn(7680, 17408, device=device, dtype=torch.bfloat16) for _ in range(2))
    _check("silu_mul 7680x17408", silu_mul(gate, up), silu_mul_ref(gate, up), assert_close)


# ---------------------------------------------------------------------------------------------------
# sigmoid_gate_mul: attention's output gate. x * sigmoid(g) is a product of x and a positive factor (no
# cancellation), so the same per-element bound of one output rounding holds.


def _gate_view(tokens: int, heads: int, head_dim: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """The gate as GatedAttention makes it: of a fused [T, 2HD + 2H_kvD] qkv projection output (H_kv = 4),
    the q | gate part viewed [T, H, 2D] and split; the second half, strides (row, 2D, 1)."""
    q_size, kv_size = 2 * heads * head_dim, 4 * head_dim
    fused = torch.randn(tokens, q_size + 2 * kv_size, device=device, dtype=dtype) * 4
    q = fused.split([q_size, kv_size, kv_size], dim=-1)[0]
    gate = q.view(tokens, heads, 2 * head_dim).chunk(2, dim=-1)[1]
    assert gate.stride()[1:] == (2 * head_dim, 1) and not gate.is_contiguous()
    return gate


@pytest.mark.parametrize("head_dim", [64, 256, 60])
@pytest.mark.parametrize("heads", [2, 24])
@pytest.mark.parametrize("tokens", [1, 3, 37])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_sigmoid_gate_mul(tokens, heads, head_dim, dtype, device, assert_close):
    gate = _gate_view(tokens, heads, head_dim, dtype, device)
    x = torch.randn(tokens, heads, head_dim, device=device, dtype=dtype)
    out = sigmoid_gate_mul(x, gate)
    assert out.shape == (tokens, heads, head_dim) and out.is_contiguous()
    _check(
        f"sigmoid_gate_mul T{tokens} H{heads} D{head_dim}", out, sigmoid_gate_mul_ref(x, gate), assert_close
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_sigmoid_gate_mul_contiguous_and_strided_x(dtype, device, assert_close):
    """A contiguous gate, and an x with its token and head strides swapped (unit stride along D only)."""
    gate = torch.randn(5, 6, 40, device=device, dtype=dtype) * 4
    x = torch.randn(5, 6, 40, device=device, dtype=dtype)
    _check("contiguous", sigmoid_gate_mul(x, gate), sigmoid_gate_mul_ref(x, gate), assert_close)
    x_t = torch.randn(6, 5, 40, device=device, dtype=dtype).transpose(0, 1)
    strided_gate = _gate_view(5, 6, 40, dtype, device)
    out = sigmoid_gate_mul(x_t, strided_gate)
    assert out.is_contiguous()
    _check("transposed x", out, sigmoid_gate_mul_ref(x_t, strided_gate), assert_close)


def test_sigmoid_gate_mul_saturates(device):
    """Large gates: sigmoid -> 1 exactly (out == x) and -> 0 (exp overflows to inf: out == 0, no NaN)."""
    x = torch.randn(2, 3, 64, device=device, dtype=torch.bfloat16)
    big = torch.full_like(x, 200.0)
    assert torch.equal(sigmoid_gate_mul(x, big), x)
    assert torch.equal(sigmoid_gate_mul(x, -big), torch.zeros_like(x))


@pytest.mark.parametrize(
    "tiles", [SigmoidGateMulTiles(1, 256, 2), SigmoidGateMulTiles(16, 256, 8), SigmoidGateMulTiles(2, 64, 2)]
)
def test_sigmoid_gate_mul_other_tiles(tiles, device, assert_close):
    """Two of the tile shapes the H200 sweep in bench/kernels/hot_path.py tries (the default one runs above)
    and a narrow one (several column blocks a row); D = 300 leaves a masked column tail, 7 x 24 rows a masked
    row tail for 16-row blocks."""
    gate = _gate_view(7, 24, 300, torch.bfloat16, device)
    x = torch.randn(7, 24, 300, device=device, dtype=torch.bfloat16)
    out = _launch_sigmoid_gate_mul(x, gate, tiles)
    _check(f"tiles {tiles}", out, sigmoid_gate_mul_ref(x, gate), assert_close)


def test_sigmoid_gate_mul_empty(device):
    x = torch.randn(0, 24, 256, device=device, dtype=torch.bfloat16)
    assert sigmoid_gate_mul(x, x).shape == (0, 24, 256)


def test_sigmoid_gate_mul_prefill_geometry(device, assert_close):
    """The 27B attention layer at a 7,680-token prefill chunk (CUDA only: too slow for the interpreter)."""
    if device != "cuda":
        pytest.skip("7680 x 24 x 256 runs on a real GPU only")
    gate = _gate_view(7680, 24, 256, torch.bfloat16, device)
    x = torch.randn(7680, 24, 256, device=device, dtype=torch.bfloat16)
    _check(
        "sigmoid_gate_mul 7680x24x256", sigmoid_gate_mul(x, gate), sigmoid_gate_mul_ref(x, gate), assert_close
    )
