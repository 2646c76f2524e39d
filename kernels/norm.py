"""RMSNorm references for the Qwen3.5 family.

Two forms appear in the model:

* ``rms_norm_ref``: the zero-centred ``(1 + w)`` RMSNorm used for every residual-stream norm and
  for the per-head q/k norms of gated attention (HF ``Qwen3_5RMSNorm``; weights are stored as the
  offset from one, so a freshly initialised weight is all zeros).
* ``gated_rms_norm_ref``: the plain-weight RMSNorm with a SiLU output gate applied per head to the
  Gated DeltaNet output (HF ``Qwen3_5RMSNormGated``; norm first, then ``* silu(gate)``).

Math is float32; the result is cast back to the input dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
