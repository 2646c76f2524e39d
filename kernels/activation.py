"""Elementwise gates: the SiLU-gated activation of the feed-forward blocks, ``silu(gate) * up``, and the
sigmoid output gate of gated attention, ``x * sigmoid(gate)``.

``silu_mul_ref`` is the specification: float32 math, one rounding to the input dtype at the end. (The
eager ``F.silu(gate) * up`` on bf16 rounds twice, once after the silu and once after the product: on
random bf16 inputs about a quarter of the elements then differ from this by one bf16 ulp, and the
single rounding is the closer of the two to the exact product.)

The Triton launcher ``silu_mul`` does it in one pass (read gate, read up, write out) where the eager
expression takes two kernels and writes and re-reads the silu; it falls back to the reference off CUDA.
``gate`` and ``up`` need unit stride along the last dim only: they may be the two halves of one
``[..., 2I]`` tensor.

``sigmoid_gate_mul_ref`` (attention's output gate, before ``o_proj``) likewise computes in float32 and
rounds once. The eager ``out * torch.sigmoid(gate.float()).to(out.dtype)`` it replaces rounds twice on bf16
(the sigmoid to bf16, then the product) and takes 3-4 kernels (cast, sigmoid, cast, mul); in fp32 the two
are the same expression. The Triton launcher ``sigmoid_gate_mul`` is one pass over x [T, H, D] and the
gate, a strided view of the fused qkv projection output (per head, the second half of the [2D] q | gate
slice), read in place; it writes a new contiguous [T, H, D].
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from kernels._dispatch import HAS_TRITON, use_triton
from kernels.pdl import pdl_args

if HAS_TRITON:
    import triton
    import triton.language as tl

    from kernels.pdl import pdl_launch_dependents, pdl_wait


def silu_mul_ref(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` in float32, rounded once to gate's dtype.

    gate, up: [..., I] (same shape) -> [..., I] (dtype of gate).
    """
    return (F.silu(gate.float()) * up.float()).to(gate.dtype)


if HAS_TRITON:

    @triton.jit
    def _silu_mul_kernel(
        gate_ptr,
        up_ptr,
        out_ptr,
        num_rows,
        inter,
        gate_stride,
        up_stride,
        out_stride,
        BLOCK_ROWS: tl.constexpr,
        BLOCK_COLS: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # 1-D grid (cdiv(num_rows, BLOCK_ROWS) * cdiv(inter, BLOCK_COLS),): one program does one
        # [BLOCK_ROWS, BLOCK_COLS] tile; the column blocks of one row block are consecutive program ids.
        pdl_wait(PDL)  # kernels/pdl.py: before any read of a predecessor's output or any write
        pdl_launch_dependents(PDL)
        pid = tl.program_id(0)
        num_col_blocks = tl.cdiv(inter, BLOCK_COLS)
        rows = ((pid // num_col_blocks) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)).to(tl.int64)
        cols = (pid % num_col_blocks) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
        mask = (rows < num_rows)[:, None] & (cols < inter)[None, :]
        gate = tl.load(gate_ptr + rows[:, None] * gate_stride + cols[None, :], mask=mask, other=0.0)
        up = tl.load(up_ptr + rows[:, None] * up_stride + cols[None, :], mask=mask, other=0.0)
        gate = gate.to(tl.float32)
        out = gate / (1.0 + tl.exp(-gate)) * up.to(tl.float32)
        tl.store(
            out_ptr + rows[:, None] * out_stride + cols[None, :], out.to(out_ptr.dtype.element_ty), mask=mask
        )


class SiluMulTiles(NamedTuple):
    """Launch shape of ``_silu_mul_kernel``: one program's tile and its warps."""

    block_rows: int
    block_cols: int
    warps: int


def silu_mul_tiles(inter: int) -> SiluMulTiles:
    """The default tile for an intermediate size: 1024 columns of one row (8 elements, 16 bytes of bf16 a
    thread at 4 warps; 17408 = 17 x 1024, so no masked tail at the 27B geometry), or whole rows packed up
    to 1024 elements when the row is shorter."""
    block_cols = min(1024, triton.next_power_of_2(max(inter, 1)))
    return SiluMulTiles(max(1, 1024 // block_cols), block_cols, 4)


def _rows(t: torch.Tensor, inter: int) -> torch.Tensor:
    """[..., I] -> [N, I] with unit stride along I (a view where possible)."""
    t2 = t.reshape(-1, inter)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _launch_silu_mul(gate: torch.Tensor, up: torch.Tensor, tiles: SiluMulTiles) -> torch.Tensor:
    """``silu_mul`` with a given tile (the launcher's choice is ``silu_mul_tiles``; the bench sweeps others)."""
    assert gate.shape == up.shape, f"gate {tuple(gate.shape)} != up {tuple(up.shape)}"
    assert gate.dtype == up.dtype, f"gate {gate.dtype} != up {up.dtype}"
    assert gate.dtype in (torch.bfloat16, torch.float16, torch.float32), f"dtype {gate.dtype}"
    assert gate.device == up.device, f"gate on {gate.device}, up on {up.device}"
    inter = gate.shape[-1]
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    if out.numel() == 0:
        return out
    gate2, up2, out2 = _rows(gate, inter), _rows(up, inter), out.view(-1, inter)
    num_rows = out2.shape[0]
    grid = (triton.cdiv(num_rows, tiles.block_rows) * triton.cdiv(inter, tiles.block_cols),)
    _silu_mul_kernel[grid](
        gate2, up2, out2, num_rows, inter, gate2.stride(0), up2.stride(0), out2.stride(0),
        BLOCK_ROWS=tiles.block_rows, BLOCK_COLS=tiles.block_cols, num_warps=tiles.warps, **pdl_args(gate.device),
    )  # fmt: skip
    return out


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Launcher for ``silu_mul_ref`` (same contract): one pass, gate and up read once, out written once.

    gate, up: [..., I], same shape and dtype, unit stride along I (any row strides) -> [..., I].
    """
    if not use_triton(gate, up):
        return silu_mul_ref(gate, up)
    return _launch_silu_mul(gate, up, silu_mul_tiles(gate.shape[-1]))


def sigmoid_gate_mul_ref(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``x * sigmoid(gate)`` in float32, rounded once to x's dtype.

    x: [T, H, D], the attention output (contiguous in the model; any strides work here).
    gate: [T, H, D], same shape and dtype; in attention a strided view, the second half of each head's [2D]
    slice of the fused qkv projection output: strides (row stride of the fused output, 2 * D, 1).
    -> [T, H, D] (dtype of x).
    """
    return (x.float() * torch.sigmoid(gate.float())).to(x.dtype)


if HAS_TRITON:

    @triton.jit
    def _sigmoid_gate_mul_kernel(
        x_ptr,
        gate_ptr,
        out_ptr,
        num_rows,
        num_heads,
        head_dim,
        x_stride_t,
        x_stride_h,
        gate_stride_t,
        gate_stride_h,
        BLOCK_ROWS: tl.constexpr,
        BLOCK_COLS: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # 1-D grid (cdiv(T * H, BLOCK_ROWS) * cdiv(D, BLOCK_COLS),): one program does one [BLOCK_ROWS,
        # BLOCK_COLS] tile of the (token, head) rows; row r is token r // H, head r % H, read through each
        # input's token and head strides (unit stride along D); out is contiguous [T * H, D].
        pdl_wait(PDL)  # kernels/pdl.py: before any read of a predecessor's output or any write
        pdl_launch_dependents(PDL)
        pid = tl.program_id(0)
        num_col_blocks = tl.cdiv(head_dim, BLOCK_COLS)
        rows = ((pid // num_col_blocks) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)).to(tl.int64)
        cols = (pid % num_col_blocks) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
        mask = (rows < num_rows)[:, None] & (cols < head_dim)[None, :]
        token, head = rows // num_heads, rows % num_heads
        x_rows = token * x_stride_t + head * x_stride_h
        gate_rows = token * gate_stride_t + head * gate_stride_h
        x = tl.load(x_ptr + x_rows[:, None] + cols[None, :], mask=mask, other=0.0)
        gate = tl.load(gate_ptr + gate_rows[:, None] + cols[None, :], mask=mask, other=0.0)
        out = x.to(tl.float32) / (1.0 + tl.exp(-gate.to(tl.float32)))
        tl.store(
            out_ptr + rows[:, None] * head_dim + cols[None, :], out.to(out_ptr.dtype.element_ty), mask=mask
        )


class SigmoidGateMulTiles(NamedTuple):
    """Launch shape of ``_sigmoid_gate_mul_kernel``: one program's tile of (token, head) rows and its warps."""

    block_rows: int
    block_cols: int
    warps: int


def sigmoid_gate_mul_tiles(head_dim: int) -> SigmoidGateMulTiles:
    """The default tile for a head size: whole head rows packed up to 1024 elements (8 elements, 16 bytes of
    bf16 a thread at 4 warps; the 27B's D = 256 gives 4 heads a program, 6 programs for one decode token),
    or 1024 columns of one row when the head is longer."""
    block_cols = min(1024, triton.next_power_of_2(max(head_dim, 1)))
    return SigmoidGateMulTiles(max(1, 1024 // block_cols), block_cols, 4)


def _check_sigmoid_gate_mul(x: torch.Tensor, gate: torch.Tensor) -> None:
    assert x.dim() == 3, f"x {tuple(x.shape)}: expected [T, H, D]"
    assert x.shape == gate.shape, f"x {tuple(x.shape)} != gate {tuple(gate.shape)}"
    assert x.dtype == gate.dtype, f"x {x.dtype} != gate {gate.dtype}"
    assert x.dtype in (torch.bfloat16, torch.float16, torch.float32), f"dtype {x.dtype}"
    assert x.device == gate.device, f"x on {x.device}, gate on {gate.device}"
    assert x.stride(-1) == 1 or x.shape[-1] <= 1, f"x strides {x.stride()}: need unit stride along D"
    assert gate.stride(-1) == 1 or gate.shape[-1] <= 1, (
        f"gate strides {gate.stride()}: need unit stride along D"
    )


def _launch_sigmoid_gate_mul(x: torch.Tensor, gate: torch.Tensor, tiles: SigmoidGateMulTiles) -> torch.Tensor:
    """``sigmoid_gate_mul`` with a given tile (the launcher's choice is ``sigmoid_gate_mul_tiles``; the bench
    sweeps others)."""
    _check_sigmoid_gate_mul(x, gate)
    num_tokens, num_heads, head_dim = x.shape
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    num_rows = num_tokens * num_heads
    grid = (triton.cdiv(num_rows, tiles.block_rows) * triton.cdiv(head_dim, tiles.block_cols),)
    _sigmoid_gate_mul_kernel[grid](
        x, gate, out, num_rows, num_heads, head_dim, x.stride(0), x.stride(1), gate.stride(0), gate.stride(1),
        BLOCK_ROWS=tiles.block_rows, BLOCK_COLS=tiles.block_cols, num_warps=tiles.warps, **pdl_args(x.device),
    )  # fmt: skip
    return out


def sigmoid_gate_mul(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """Launcher for ``sigmoid_gate_mul_ref`` (same contract): one pass, x and gate read once (in place,
    through their strides), out written once.

    x, gate: [T, H, D], same shape and dtype, unit stride along D (any token and head strides)
    -> [T, H, D], contiguous, dtype of x.
    """
    _check_sigmoid_gate_mul(x, gate)
    if not use_triton(x, gate):
        return sigmoid_gate_mul_ref(x, gate).contiguous()  # a no-op for a contiguous x
    return _launch_sigmoid_gate_mul(x, gate, sigmoid_gate_mul_tiles(x.shape[-1]))
