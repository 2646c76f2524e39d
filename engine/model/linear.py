"""Linear layers that own their weight, its storage format and the method that applies it.

A ``Linear`` is a bias-free ``y = x @ W^T`` ([T, K] -> [T, N]). It holds whatever its format stores (a dense
``weight`` parameter [N, K], or a quantized payload's planes) and a ``LinearMethod`` chosen at load that knows
how to apply those tensors (vLLM's ``LinearBase`` + ``quant_method``). Model code calls the layer
(``self.o_proj(x)``) and never asks which format a weight is in.

A layer can be a *fused parent*: one stored matrix whose row ranges are several logical projections (the
attention ``qkv_proj``, the GDN ``in_proj``, the MLP ``gate_up_proj``; in the quantized artifacts the
stored ``query_key``, ``gate_value``, ``value_z``, ``mlp/gate_up`` ...). ``outputs`` names those row ranges
in order. A module's input projections (one fused parent, or several parents whose outputs together form the
logical set) run through its ``InputProjections`` (``bound_inputs``): bound once from the parents' row ranges,
it returns the tensors the module reads as views of each parent's output (no copy), with no per-step name
lookups.

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

import itertools
from collections.abc import Callable, Sequence

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

    # NOTE: calling the layer is calling ``forward``, without nn.Module's hook machinery (~1 us a call, and a
    # decode step makes ~4 of these calls a layer, each on the host's launch path in eager mode): forward hooks
    # registered on a Linear do not run.
    __call__ = forward

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


class InputProjections:
    """A module's input projections bound once: the parent layers to run and where each group of named outputs
    the module reads sits in their outputs, so a step runs each parent and at most one split per parent, with no
    name lookups (the decode step runs this ~100 times; eager decode is launch-bound on the host).

    ``groups``: per tensor the module wants, the output names it spans, in column order (``("query", "key",
    "value")``: the GDN conv input). A group whose names are adjacent columns of one parent is one view of that
    parent's output (a fused parent: views of one GEMM, no copy); one spanning two parents (a quantized artifact's
    27B ``query_key`` Q4 + ``value_z`` Q5) is concatenated, a copy of the activations (never of the weights).
    ``run(x)`` returns one tensor per group, in order.

    A module keeps the plan of its current ``input_projections`` (``bound_inputs``): whoever swaps its parents
    assigns ``input_projections`` afterwards (``fuse_projections``, the artifact loader), which rebinds.
    """

    def __init__(
        self, names: tuple[str, ...], layers: Sequence[Linear], groups: Sequence[Sequence[str]]
    ) -> None:
        self.names = names  # the ``input_projections`` tuple this plan was bound for (compared by identity)
        self.layers = tuple(layers)
        where: dict[str, tuple[int, int, int]] = {}  # output name -> (parent, begin, end)
        for index, layer in enumerate(self.layers):
            for name, (begin, end) in layer.row_ranges().items():
                where[name] = (index, begin, end)
        # per group: its (parent, begin, end) runs of adjacent columns
        segments: list[list[tuple[int, int, int]]] = []
        for group in groups:
            missing = [n for n in group if n not in where]
            if missing:
                raise ValueError(
                    f"input projections {names}: no output named {missing} (have {sorted(where)})"
                )
            runs: list[tuple[int, int, int]] = []
            for name in group:
                parent, begin, end = where[name]
                if runs and runs[-1][0] == parent and runs[-1][2] == begin:
                    runs[-1] = (parent, runs[-1][1], end)
                else:
                    runs.append((parent, begin, end))
            segments.append(runs)
        # each parent's output is cut at every run boundary: one split_with_sizes, every run one piece
        cuts: list[list[int]] = [[0, layer.out_features] for layer in self.layers]
        for runs in segments:
            for parent, begin, end in runs:
                cuts[parent] += [begin, end]
        bounds = [sorted(set(points)) for points in cuts]
        # per parent: its split sizes (None: the whole output is one piece)
        self.sizes: tuple[list[int] | None, ...] = tuple(
            None if len(b) == 2 else [end - begin for begin, end in itertools.pairwise(b)] for b in bounds
        )
        # per group: the (parent, piece) pairs it concatenates (one pair: a view)
        self.pieces: tuple[tuple[tuple[int, int], ...], ...] = tuple(
            tuple((parent, self._piece(bounds[parent], begin, end)) for parent, begin, end in runs)
            for runs in segments
        )
        flat = [pairs[0] for pairs in self.pieces if len(pairs) == 1]
        # the common case, one fused parent read whole and in order: its split is the result itself
        self.identity = (
            len(self.layers) == 1
            and flat == [(0, i) for i in range(len(self.pieces))]
            and (len(self.pieces) == len(bounds[0]) - 1)
        )

    @staticmethod
    def _piece(bounds: list[int], begin: int, end: int) -> int:
        first = bounds.index(begin)
        if bounds[first + 1] != end:
            raise ValueError(
                f"output columns [{begin}, {end}) overlap another group's; groups must be disjoint"
            )
        return first

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``x`` [T, K] -> one tensor per group (views of the parents' outputs where a group is one run)."""
        if self.identity:
            layer, sizes = self.layers[0], self.sizes[0]
            y = layer.method.apply(layer, x)
            return (y,) if sizes is None else y.split_with_sizes(sizes, dim=-1)
        outs = []
        for layer, sizes in zip(self.layers, self.sizes, strict=True):
            y = layer.method.apply(layer, x)
            outs.append((y,) if sizes is None else y.split_with_sizes(sizes, dim=-1))
        return tuple(
            outs[pairs[0][0]][pairs[0][1]]
            if len(pairs) == 1
            else torch.cat([outs[p][i] for p, i in pairs], dim=-1)
            for pairs in self.pieces
        )


Groups = Sequence[Sequence[str]]


def bound_inputs(module: nn.Module, groups: Groups | Callable[[set[str]], Groups]) -> InputProjections:
    """``module``'s plan for its current ``input_projections`` (bound on first use and whenever that tuple is
    assigned anew), kept in ``module._input_plan``. ``groups`` may depend on the output names the parents
    have (a function of that set: attention reads ``query_gate`` or ``query`` + ``gate``)."""
    names: tuple[str, ...] = module.input_projections  # type: ignore[assignment]
    plan: InputProjections | None = module.__dict__.get("_input_plan")
    if plan is None or plan.names is not names:
        layers = [getattr(module, n) for n in names]
        if callable(groups):
            groups = groups({name for layer in layers for name, _ in layer.outputs})
        plan = InputProjections(names, layers, groups)
        module.__dict__["_input_plan"] = plan
    return plan
