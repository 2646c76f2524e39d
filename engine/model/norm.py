"""RMSNorm modules holding the checkpoint weights; the math lives in ``kernels.norm``."""

from __future__ import annotations

import torch
from torch import nn

from kernels.norm import gated_rms_norm_ref, rms_norm_ref


class RMSNorm(nn.Module):
    """Zero-centred ``(1 + w)`` RMSNorm (residual stream, q/k norms)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm_ref(x, self.weight, self.eps)


class GatedRMSNorm(nn.Module):
    """Plain-weight RMSNorm followed by ``* silu(gate)`` (GDN output norm, per head)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return gated_rms_norm_ref(x, gate, self.weight, self.eps)
