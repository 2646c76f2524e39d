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
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels._dispatch import HAS_TRITON, use_triton

if HAS_TRITON:
    import triton
    import triton.language as tl


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
        x_stride,
        res_stride,
        gate_stride,
        out_stride,
        sum_stride,
        eps,
        HAS_RESIDUAL: tl.constexpr,
        HAS_GATE: tl.constexpr,
        ONE_PLUS_WEIGHT: tl.constexpr,
        BLOCK_ROWS: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        # grid (cdiv(num_rows, BLOCK_ROWS),): one program normalises BLOCK_ROWS whole rows in registers.
        rows = (tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)).to(tl.int64)
        cols = tl.arange(0, BLOCK_D)
        col_mask = cols < dim
        mask = (rows < num_rows)[:, None] & col_mask[None, :]
        x = tl.load(x_ptr + rows[:, None] * x_stride + cols[None, :], mask=mask, other=0.0)
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
            gate = tl.load(gate_ptr + rows[:, None] * gate_stride + cols[None, :], mask=mask, other=0.0)
            gate = gate.to(tl.float32)
            y = y * (gate * tl.sigmoid(gate))
        tl.store(
            out_ptr + rows[:, None] * out_stride + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask
        )


def _rows(t: torch.Tensor, dim: int) -> torch.Tensor:
    """[..., D] -> [N, D] with unit stride along D (a view where possible)."""
    t2 = t.reshape(-1, dim)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


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
    x2 = _rows(x, dim)
    res2 = _rows(residual, dim) if residual is not None else x2
    gate2 = _rows(gate, dim) if gate is not None else x2
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out2 = out.view(-1, dim)
    summed = torch.empty_like(out) if residual is not None else None
    sum2 = summed.view(-1, dim) if summed is not None else out2
    num_rows = x2.shape[0]
    block_d = triton.next_power_of_2(dim)
    block_rows = max(1, min(16, 2048 // block_d))
    grid = (triton.cdiv(num_rows, block_rows),)
    if num_rows:
        _rms_norm_kernel[grid](
            x2, res2, gate2, weight, out2, sum2, num_rows, dim,
            x2.stride(0), res2.stride(0), gate2.stride(0), out2.stride(0), sum2.stride(0), eps,
            HAS_RESIDUAL=residual is not None, HAS_GATE=gate is not None, ONE_PLUS_WEIGHT=one_plus_weight,
            BLOCK_ROWS=block_rows, BLOCK_D=block_d, num_warps=8 if block_d >= 4096 else 4,
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
