"""Quantized weights in the model: the ``LinearMethod`` of the quantized formats and the quantized embedding.

A quantized ``Linear`` stores one artifact object's payload (uint8, the bytes exactly as the file holds them,
copied once to the device) as a buffer, and ``kernels.quant.view_planes`` views of its planes (``qweight``,
no copy); on a GPU under ``NINFER_QUANT_GEMV=packed`` (the default) a row-split payload's code planes are first reordered in
place into the packed decode GEMV's layout (``view_planes(..., repack=True)``, ``kernels.quant.repack``). ``QuantMethod.apply`` is
``kernels.quant.quant_linear`` (the decode-in-register GEMV for at most 8 rows, the GEMM above that, on CUDA;
the exact reference ``quant_linear_ref`` elsewhere). A fused parent is one
such payload; its row ranges are the layer's ``outputs`` (the activations are split, the weight never is).

NVFP4 sites keep their FP32 input divisor on the weight (``QuantWeight.input_divisor``) for a W4A4 prefill
path; today every format runs A16.

``QuantEmbedding``: a token embedding stored quantized (Q6 / W8 / FP8 rows) gathers the requested rows' plane
slices and dequantizes just those (``kernels.quant.dequantize``), in the model dtype.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from engine.model.linear import Linear, LinearMethod
from kernels import _dispatch
from kernels.quant import QuantWeight, dequantize, quant_linear, view_planes
from kernels.quant.formats import NVFP4


class QuantMethod(LinearMethod):
    """``x @ W^T`` for a quantized ``W`` (``layer.qweight``) through ``kernels.quant.quant_linear``."""

    def __init__(self, fmt: str) -> None:
        self.format = fmt

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        qweight = layer.qweight
        assert qweight is not None, f"QuantMethod({self.format}): the layer holds no quantized weight"
        return quant_linear(x, qweight)

    def __repr__(self) -> str:
        return f"QuantMethod({self.format})"


_METHODS: dict[str, QuantMethod] = {}


def quant_method(fmt: str) -> QuantMethod:
    """The (shared, stateless) method of a format."""
    return _METHODS.setdefault(fmt, QuantMethod(fmt))


def make_quantized(
    layer: Linear, fmt: str, payload: torch.Tensor, input_divisor: float | None = None
) -> None:
    """Turn ``layer`` into a quantized layer holding ``payload`` (uint8 1-D on its final device)."""
    layer.set_method(quant_method(fmt), {"payload": payload})
    # packed (the default): on a GPU the row-split planes are rewritten in place into the decode GEMV's layout
    layer.qweight = view_planes(
        fmt,
        payload,
        (layer.out_features, layer.in_features),
        input_divisor=input_divisor,
        repack=payload.is_cuda and _dispatch.QUANT_GEMV_MODE == "packed",
    )


def quantized_linear(
    in_features: int, out_features: int, outputs: list[tuple[str, int]], fmt: str, payload: torch.Tensor
) -> Linear:
    """A new quantized ``Linear`` (a stored fused parent) holding ``payload``."""
    with torch.device("meta"):
        layer = Linear(in_features, out_features, outputs)
    make_quantized(layer, fmt, payload)
    return layer


class QuantEmbedding(nn.Module):
    """A quantized [vocab, hidden] token embedding: ``forward(ids)`` dequantizes only the rows asked for."""

    def __init__(self, fmt: str, payload: torch.Tensor, shape: tuple[int, int], dtype: torch.dtype) -> None:
        super().__init__()
        if fmt == NVFP4:
            raise ValueError(f"{fmt}: an embedding needs row-addressable scales (row-split or FP8 rows)")
        self.format, self.dtype = fmt, dtype
        self.num_embeddings, self.embedding_dim = shape
        self.register_buffer("payload", payload, persistent=False)
        self.qweight: QuantWeight = view_planes(fmt, payload, shape)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        qw, flat = self.qweight, ids.reshape(-1)
        rows = replace(
            qw,
            shape=(flat.numel(), qw.shape[1]),
            codes=qw.codes.index_select(0, flat),
            high=None if qw.high is None else qw.high.index_select(0, flat),
            scales=qw.scales.index_select(0, flat),
        )
        return dequantize(rows).to(self.dtype).view(*ids.shape, self.embedding_dim)
