"""RMSNorm modules holding the checkpoint weights; the math lives in ``kernels.norm``.

The launchers run their Triton kernels on CUDA tensors and the torch references elsewhere, with the
same contract, so the CPU tests exercise the references and the GPU the kernels.

Calling a norm is calling its ``forward`` (``__call__ = forward``), without nn.Module's hook machinery: a decode
step calls ~3 norms a layer and, run eagerly, the host's Python per layer is the step time. Forward hooks
registered on these modules do not run.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.norm import add_rms_norm, gated_rms_norm, rms_norm


class RMSNorm(nn.Module):
    """Zero-centred ``(1 + w)`` RMSNorm (residual stream, q/k norms)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    __call__ = forward  # NOTE: no nn.Module hook machinery on the hot path (module docstring)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``h = x + residual``, ``(norm(h), h)`` in one pass (bit-equal to the add then the norm)."""
        return add_rms_norm(x, residual, self.weight, self.eps)


class GatedRMSNorm(nn.Module):
    """Plain-weight RMSNorm followed by ``* silu(gate)`` (GDN output norm, per head)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return gated_rms_norm(x, gate, self.weight, self.eps)

    __call__ = forward  # NOTE: no nn.Module hook machinery on the hot path (module docstring)
