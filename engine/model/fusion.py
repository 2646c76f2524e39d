"""Fusing a layer's input projections after its weights are loaded: one GEMM instead of several.

The checkpoint stores (and the loader assigns) each projection under its own name; a layer that reads
the same input through several projections (attention q/k/v, the GDN in_proj_*, the MLP gate/up) can
then replace them by one ``Linear`` (``engine.model.linear``) whose weight is their row concatenation and
whose ``outputs`` are theirs in order, and split the output by name (views). A decode step then streams the
same bytes in one launch instead of several, and the small projections (GDN ``in_proj_b``/``in_proj_a``: one row per head) stop costing a launch each.

This module owns only the weight surgery of dense layers; each layer owns its fused forward
(``fuse_projections``). Quantized artifacts store their fused parents already fused (one object whose
method knows the row ranges), so nothing is concatenated at load for them.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.model.linear import DenseMethod, Linear


def concat_linears(*linears: Linear) -> Linear:
    """One dense ``Linear`` whose weight is the row concatenation of ``linears``' weights ([sum of
    out_features, in_features], their dtype and device) and whose ``outputs`` are theirs, in order.

    The concatenation is the only allocation (the new module is built on the meta device, then given the
    concatenated weight): the caller drops the originals, so fusing a layer costs one layer's
    projections of extra memory at most, for as long as the caller keeps the originals.
    """
    assert linears, "nothing to concatenate"
    in_features = linears[0].in_features
    weights = []
    for layer in linears:
        assert isinstance(layer.method, DenseMethod) and layer.weight is not None, (
            f"only dense layers fuse at load, not {layer.method.format}"
        )
        assert layer.in_features == in_features, f"in_features {layer.in_features} != {in_features}"
        weights.append(layer.weight.detach())
    with torch.no_grad():
        weight = torch.cat(weights, dim=0)
    outputs = [out for layer in linears for out in layer.outputs]
    with torch.device("meta"):
        fused = Linear(in_features, weight.shape[0], outputs)
    fused.weight = nn.Parameter(weight, requires_grad=False)
    return fused
