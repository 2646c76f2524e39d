"""Linear layers that own their weight, its storage format and the method that applies it.

A ``Linear`` is a bias-free ``y = x @ W^T`` ([T, K] -> [T, N]). It holds whatever its format stores (a dense
``weight`` parameter [N, K], or a quantized payload's planes) and a ``LinearMethod`` chosen at load that knows
how to apply those tensors (vLLM's ``LinearBase`` + ``quant_method``). Model code calls the layer
(``self.o_proj(x)``) and never asks which format a weight is in.

A layer can be a *fused parent*: one stored matrix whose row ranges are several logical projections (the
attention ``qkv_proj``, the GDN ``in_proj``, the MLP ``gate_up_proj``; in the quantized artifacts the
stored ``query_key``, ``gate_value``, ``value_z``, ``mlp/gate_up`` ...). ``outputs`` names those row ranges
in order; ``split(y)`` returns each range of the output as a view (no copy). ``project`` runs a layer's
input projections (one fused parent, or several parents whose outputs together form the logical set) and
returns the named outputs.

The method interface (the seam every format implements):

- ``method.format``: the artifact format name the method reads (``"BF16"`` for the dense method);
- ``method.apply(layer, x)``: ``x`` [T, K] (unit stride along K, any row stride) -> [T, N] in ``x``'s dtype,
  from the tensors the layer holds; no host sync (the decode step is captured in a CUDA graph);
- ``method.weight_bytes(layer)``: the bytes the layer's stored tensors occupy (memory accounting).

``DenseMethod`` is today's path: ``kernels.linear.linear`` (cuBLAS by default, the Triton GEMV under
``NINFER_GEMV``), so a dense model runs exactly what it ran before this layer existed. Quantized methods
(``engine.model.quant``) hold the packed planes of one artifact object and launch ``kernels.quant``'s
decode-in-register kernels.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from kernels.linear import linear
from kernels.quant import QuantWeight

Outputs = tuple[tuple[str, int], ...]  # (name, rows) per logical projection, in row order


class LinearMethod:
    """How a ``Linear``'s stored tensors are applied (see the module docstring for the contract)."""

    format = "?"

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def weight_bytes(self, layer: Linear) -> int:
        return sum(t.numel() * t.element_size() for t in layer.stored_tensors())


class DenseMethod(LinearMethod):
    """A plain floating-point ``weight`` [N, K] in the model dtype: ``kernels.linear.linear``."""

    format = "BF16"

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        weight = layer.weight
        assert weight is not None, "DenseMethod: the layer holds no dense weight"
        return linear(x, weight)


DENSE = DenseMethod()


class Linear(nn.Module):
    """Bias-free ``y = x @ W^T`` whose ``method`` reads the tensors the layer stores.

    Dense (the default, and what ``__init__`` builds): ``weight`` [out_features, in_features] is an
    ``nn.Parameter`` under the checkpoint's name (``...o_proj.weight``), so loading stays a name-for-name
    assignment. A quantized method replaces it by its own buffers (``set_method``).
    """

    def __init__(self, in_features: int, out_features: int, outputs: Sequence[tuple[str, int]] = ()) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.outputs: Outputs = tuple(outputs) or (("out", out_features),)
        rows = sum(n for _, n in self.outputs)
        assert rows == out_features, f"outputs {self.outputs} cover {rows} rows, not {out_features}"
        self.weight: nn.Parameter | None = nn.Parameter(
            torch.empty(out_features, in_features), requires_grad=False
        )
        self.method: LinearMethod = DENSE
        self.qweight: QuantWeight | None = None  # a quantized method's plane views (engine.model.quant)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self, x)

    def split(self, y: torch.Tensor) -> dict[str, torch.Tensor]:
        """``y`` [T, out_features] -> each named row range's columns, views of ``y``."""
        if len(self.outputs) == 1:
            return {self.outputs[0][0]: y}
        parts = y.split([n for _, n in self.outputs], dim=-1)
        return {name: part for (name, _), part in zip(self.outputs, parts, strict=True)}

    def row_ranges(self) -> dict[str, tuple[int, int]]:
        """Each output's half-open row range [begin, end) in the stored matrix."""
        ranges, begin = {}, 0
        for name, rows in self.outputs:
            ranges[name] = (begin, begin + rows)
            begin += rows
        return ranges

    def stored_tensors(self) -> list[torch.Tensor]:
        return [t for t in (*self.parameters(recurse=False), *self.buffers(recurse=False)) if t is not None]

    def set_method(self, method: LinearMethod, tensors: dict[str, torch.Tensor]) -> None:
        """Store ``tensors`` (non-persistent buffers, the format's planes) in place of the dense weight and
        apply them with ``method`` from now on."""
        self.weight = None
        for name, tensor in tensors.items():
            self.register_buffer(name, tensor, persistent=False)
        self.method = method

    def extra_repr(self) -> str:
        names = ", ".join(f"{n}:{r}" for n, r in self.outputs) if len(self.outputs) > 1 else ""
        return f"in={self.in_features}, out={self.out_features}, {self.method.format}" + (
            f", outputs=({names})" if names else ""
        )


def project(layers: Sequence[Linear], x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Run the input projections ``layers`` on ``x`` and return every named output.

    One layer (a fused parent, the usual case): views of its one output, no copy. Several parents (a
    quantized artifact whose fused roles use two formats, e.g. the 27B ``query_key`` Q4 + ``gate_value`` Q5):
    each parent's output, views as well.
    """
    out: dict[str, torch.Tensor] = {}
    for layer in layers:
        out.update(layer.split(layer(x)))
    return out


def span(parts: dict[str, torch.Tensor], names: Sequence[str]) -> torch.Tensor:
    """The outputs ``names`` side by side as one [T, sum] tensor: a view when they are adjacent columns of
    one output (a fused parent), else a concatenation (a copy of the activations, never of the weights)."""
    tensors = [parts[n] for n in names]
    if len(tensors) == 1:
        return tensors[0]
    first = tensors[0]
    width, adjacent = first.shape[-1], True
    for t in tensors[1:]:
        adjacent = (
            adjacent
            and t.stride() == first.stride()
            and (t.data_ptr() == first.data_ptr() + width * first.element_size())
        )
        width += t.shape[-1]
    if adjacent and first.dim() == 2:
        return first.as_strided((first.shape[0], width), first.stride())
    return torch.cat(tensors, dim=-1)
