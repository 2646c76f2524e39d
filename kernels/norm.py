"""RMSNorm references for the Qwen3.5 family.

Two forms appear in the model:

* ``rms_norm_ref``: the zero-centred ``(1 + w)`` RMSNorm used for every residual-stream norm and
  for the per-head q/k norms of gated attention (HF ``Qwen3_5RMSNorm``; weights are stored as the
  offset from one, so a freshly initialised weight is all zeros).
* ``gated_rms_norm_ref``: the plain-weight RMSNorm with a SiLU output gate applied per head to the
  Gated DeltaNet output (HF ``Qwen3_5RMSNormGated``; norm first, then ``* silu(gate)``).
* ``add_rms_norm_ref``: the residual add in front of a residual-stream norm, fused with it
  (``h = x + residual`` rounded to the activation dtype, then ``rms_norm_ref(h)``; returns both).

Math is float32; the result is cast back to the input dtype. The Triton launchers ``rms_norm``,
``add_rms_norm`` and ``gated_rms_norm`` share one kernel and fall back to the references off CUDA.
Their x (and gate) may be a [T, H, D] view with any token and head strides (unit stride along D), such as
heads sliced from a fused projection's output: the kernel reads it in place, no copy; the output is
contiguous.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels._dispatch import HAS_TRITON, use_triton
from kernels.pdl import pdl_args

if HAS_TRITON:
    import triton
    import triton.language as tl

    from kernels.pdl import pdl_launch_dependents, pdl_wait


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm: ``x / rms(x) * (1 + weight)`` over the last dim.

    x: [..., D], weight: [D] -> [..., D] (dtype of x).
    """
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (normed * (1.0 + weight.float())).to(x.dtype)


def gated_rms_norm_ref(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gated RMSNorm: ``x / rms(x) * weight * silu(gate)`` over the last dim (plain weight, not 1 + w).

    x: [..., D], gate: [..., D], weight: [D] -> [..., D] (dtype of x).
    """
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (normed * weight.float() * F.silu(gate.float())).to(x.dtype)


def add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add + zero-centred RMSNorm: ``h = x + residual`` (in x.dtype), ``out = rms_norm_ref(h)``.

    x, residual: [..., D], weight: [D] -> (out [..., D], h [..., D]), both in x.dtype.
    """
    summed = (x.float() + residual.float()).to(x.dtype)
    return rms_norm_ref(summed, weight, eps), summed


if HAS_TRITON:

    @triton.jit
    def _rms_norm_kernel(
        x_ptr,
        res_ptr,
        gate_ptr,
        w_ptr,
        out_ptr,
        sum_ptr,
        num_rows,
        dim,
        num_heads,
        x_stride,
        x_head_stride,
        res_stride,
        gate_stride,
        gate_head_stride,
        out_stride,
        sum_stride,
        eps,
        HAS_RESIDUAL: tl.constexpr,
        HAS_GATE: tl.constexpr,
        ONE_PLUS_WEIGHT: tl.constexpr,
        BLOCK_ROWS: tl.constexpr,
        BLOCK_D: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # grid (cdiv(num_rows, BLOCK_ROWS),): one program normalises BLOCK_ROWS whole rows in registers.
        # x and gate address row r as (token r // num_heads, head r % num_heads) with their own token and
        # head strides (num_heads 1: one row stride); residual, sum and out are [num_rows, dim] rows.
        pdl_wait(PDL)  # kernels/pdl.py: before any read of a predecessor's output or any write
        pdl_launch_dependents(PDL)
        rows32 = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        rows = rows32.to(tl.int64)
        tokens = (rows32 // num_heads).to(tl.int64)
        heads = (rows32 % num_heads).to(tl.int64)
        cols = tl.arange(0, BLOCK_D)
        col_mask = cols < dim
        mask = (rows < num_rows)[:, None] & col_mask[None, :]
        x_rows = tokens * x_stride + heads * x_head_stride
        x = tl.load(x_ptr + x_rows[:, None] + cols[None, :], mask=mask, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + rows[:, None] * res_stride + cols[None, :], mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(sum_ptr.dtype.element_ty)
            tl.store(sum_ptr + rows[:, None] * sum_stride + cols[None, :], x, mask=mask)
        xf = x.to(tl.float32)
        inv_rms = tl.rsqrt(tl.sum(xf * xf, axis=1) / dim + eps)
        w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        if ONE_PLUS_WEIGHT:
            w = 1.0 + w
        y = xf * inv_rms[:, None] * w[None, :]
        if HAS_GATE:
            gate_rows = tokens * gate_stride + heads * gate_head_stride
            gate = tl.load(gate_ptr + gate_rows[:, None] + cols[None, :], mask=mask, other=0.0)
            gate = gate.to(tl.float32)
            y = y * (gate * tl.sigmoid(gate))
        tl.store(
            out_ptr + rows[:, None] * out_stride + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask
        )


def _rows(t: torch.Tensor, dim: int) -> torch.Tensor:
    """[..., D] -> [N, D] with unit stride along D (a view where possible)."""
    t2 = t.reshape(-1, dim)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _num_heads(*tensors: torch.Tensor | None) -> int:
    """H when some input is a [T, H, D] view (unit stride along D) whose rows have no single row stride,
    e.g. heads sliced from a fused projection's wider output row: the kernel then addresses its rows as
    (token, head) pairs instead of a copy making it [T * H, D]; 1 otherwise."""
    for t in tensors:
        if t is None or t.dim() != 3 or t.stride(2) != 1:
            continue
        tokens, heads = t.shape[0], t.shape[1]
        if tokens > 1 and heads > 1 and t.stride(0) != heads * t.stride(1):
            return heads
    return 1


def _head_rows(t: torch.Tensor, dim: int, num_heads: int) -> tuple[torch.Tensor, int, int]:
    """(tensor, token stride, head stride) addressing t's rows as the kernel does (see ``_num_heads``)."""
    if num_heads == 1:
        t2 = _rows(t, dim)
        return t2, t2.stride(0), 0
    t3 = t if t.stride(2) == 1 else t.contiguous()
    return t3, t3.stride(0), t3.stride(1)


def _launch_rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None,
    gate: torch.Tensor | None,
    one_plus_weight: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    dim = x.shape[-1]
    assert weight.shape == (dim,) and weight.is_contiguous(), f"weight {tuple(weight.shape)} for dim {dim}"
    for name, t in (("residual", residual), ("gate", gate)):
        assert t is None or t.shape == x.shape, f"{name} {tuple(t.shape)} != x {tuple(x.shape)}"
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out2 = out.view(-1, dim)
    num_heads = _num_heads(x, gate)
    x2, x_stride, x_head_stride = _head_rows(x, dim, num_heads)
    res2 = _rows(residual, dim) if residual is not None else out2
    gate_rows = _head_rows(gate, dim, num_heads) if gate is not None else (x2, 0, 0)
    gate2, gate_stride, gate_head_stride = gate_rows
    summed = torch.empty_like(out) if residual is not None else None
    sum2 = summed.view(-1, dim) if summed is not None else out2
    num_rows = out2.shape[0]
    block_d = triton.next_power_of_2(dim)
    block_rows = max(1, min(16, 2048 // block_d))
    grid = (triton.cdiv(num_rows, block_rows),)
    if num_rows:
        _rms_norm_kernel[grid](
            x2, res2, gate2, weight, out2, sum2, num_rows, dim, num_heads,
            x_stride, x_head_stride, res2.stride(0), gate_stride, gate_head_stride, out2.stride(0),
            sum2.stride(0), eps,
            HAS_RESIDUAL=residual is not None, HAS_GATE=gate is not None, ONE_PLUS_WEIGHT=one_plus_weight,
            BLOCK_ROWS=block_rows, BLOCK_D=block_d, num_warps=8 if block_d >= 4096 else 4, **pdl_args(x.device),
        )  # fmt: skip
    return out, summed


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Launcher for ``rms_norm_ref`` (same contract). x: [..., D], weight: [D]."""
    if not use_triton(x, weight):
        return rms_norm_ref(x, weight, eps)
    return _launch_rms_norm(x, weight, eps, None, None, one_plus_weight=True)[0]


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launcher for ``add_rms_norm_ref`` (same contract): one pass reads x and residual, writes out and h."""
    if not use_triton(x, residual, weight):
        return add_rms_norm_ref(x, residual, weight, eps)
    out, summed = _launch_rms_norm(x, weight, eps, residual, None, one_plus_weight=True)
    assert summed is not None
    return out, summed


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Launcher for ``gated_rms_norm_ref`` (same contract). x, gate: [..., D], weight: [D]."""
    if not use_triton(x, gate, weight):
        return gated_rms_norm_ref(x, gate, weight, eps)
    return _launch_rms_norm(x, weight, eps, None, gate, one_plus_weight=False)[0]
