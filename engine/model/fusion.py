"""Fusing a layer's input projections after its weights are loaded: one GEMM instead of several.

The checkpoint stores (and the loader assigns) each projection under its own name; a layer that reads
the same input through several projections (attention q/k/v, the GDN in_proj_*, the MLP gate/up) can
then replace them by one ``nn.Linear`` whose weight is their row concatenation, and split the output by
sizes (views). A decode step then streams the same bytes in one launch instead of several, and the
small projections (GDN ``in_proj_b``/``in_proj_a``: one row per head) stop costing a launch each.

This module owns only the weight surgery; each layer owns its fused forward (``fuse_projections``).
"""

from __future__ import annotations

import torch
from torch import nn


def concat_linears(*linears: nn.Linear) -> nn.Linear:
    """One bias-free ``nn.Linear`` whose weight is the row concatenation of ``linears``' weights
    ([sum of out_features, in_features], their dtype and device).

    The concatenation is the only allocation (the new module is built on the meta device, then given the
    concatenated weight): the caller drops the originals, so fusing a layer costs one layer's
    projections of extra memory at most, for as long as the caller keeps the originals.
    """
    assert linears, "nothing to concatenate"
    in_features = linears[0].in_features
    for linear in linears:
        assert linear.bias is None, "fused projections are bias-free"
        assert linear.in_features == in_features, f"in_features {linear.in_features} != {in_features}"
    with torch.no_grad():
        weight = torch.cat([linear.weight.detach() for linear in linears], dim=0)
    fused = nn.Linear(in_features, weight.shape[0], bias=False, device="meta")
    fused.weight = nn.Parameter(weight, requires_grad=False)
    return fused
