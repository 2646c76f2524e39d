"""A MoE layer's routed experts kept quantized on the device: ``QuantExperts``, and the one ``ExpertScratch`` that
all of a model's quantized MoE layers share for prefill.

The groupwise-int MoE profile (35B-A3B: gate_up Q4, down Q5, Q6 in layers 34, 38, 39) stores a layer's experts as
two stacked row-split weights, expert-major: gate_up ``[E * 2I, H]`` and down ``[E * H, I]``. ``QuantExperts``
holds each as a ``QuantBank``: the payload (uint8, the artifact's bytes exactly, a non-persistent buffer named
``payload``, so memory accounting and ``.to()`` see it) and its plane views (``kernels.quant.view_planes``, stored
byte order: the MoE kernels read that layout, so the planes are never repacked). No dense copy of a bank exists.

``QuantExperts.forward(x, weights, expert_ids, shared)`` is the routed sum plus ``shared`` (the gated shared
expert's output, computed by the block), the same contract as ``engine.model.mlp.Experts``; with a fifth argument
``shared_gate`` (the dense weight [1, H] of the block's ``shared_expert_gate``: ``takes_shared_gate``), ``shared``
is the ungated output and the term added is ``sigmoid(shared_gate . x) * shared``:

* at most ``QUANT_MAX_TOKENS`` tokens (decode, MTP verify, small batches): ``kernels.quant.quant_moe_experts``
  (two Triton kernels streaming the chosen experts' quantized rows on CUDA; the exact reference elsewhere), the
  shared term inside them (the gate computed by the gate_up kernel, the term added in fp32 by the down kernel
  before its one rounding: no launch of its own). No host sync, no scratch: CUDA-graph safe;
* more tokens (prefill): the dense expert path (``engine.model.mlp.routed_experts``: grouped GEMMs on CUDA) on
  the banks dequantized (one rounding to the model dtype: ``dequantize_to`` on CUDA, the reference decode
  elsewhere) into the shared ``ExpertScratch`` one at a time, in the order the path reads them: gate_up first;
  once the gate_up GEMM has run (its act computed), down into the same memory (``routed_experts`` asks for it
  then). The layers run one after another, so one buffer sized for the largest bank of the largest layer (gate_up:
  ``2 * E * I * H`` elements) serves them all; it is allocated once at load (``ExpertScratch.allocate``), so a
  step allocates nothing for it (CUDA-graph safe too) and the device memory it takes is counted with the
  weights'. At the 35B-A3B (E 256, I 512, H 2048, bf16) it is 1.07 GB (1.0 GiB; both banks side by side took
  1.5 GiB).
  Under ``NINFER_MOE_PREFILL=quant`` (``kernels._dispatch``; default ``scratch``, the path above) more tokens take
  ``kernels.quant.quant_moe_grouped`` instead: the same expert-sorted padded rows (``engine.model.mlp``'s
  ``ExpertGroups``), a grouped GEMM that dequantizes weight tiles in registers (gate_up with the activation in its
  epilogue, then down), then ``moe_combine`` with the shared term; no host sync, the scratch neither read nor
  written (nor allocated at load: ``allocate_scratch``). On the CPU its reference: bitwise the scratch path in fp32.

Must not touch: routing, the shared expert, the router (``SparseMoeBlock`` owns them).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from engine.model.mlp import Experts, expert_groups, routed_experts
from kernels import _dispatch
from kernels._dispatch import use_triton
from kernels.linear import linear
from kernels.quant import (
    GROUP_FORMATS,
    QuantWeight,
    dequantize,
    quant_moe_experts,
    quant_moe_grouped,
    view_planes,
)
from kernels.quant.quant_linear import dequantize_to

QUANT_MAX_TOKENS = 64  # tokens at or below this stream the quantized banks; above, the scratch + dense path


class QuantBank(nn.Module):
    """One stacked expert weight ([N, K]) as its stored payload and the payload's plane views (``qweight``)."""

    def __init__(self, fmt: str, payload: torch.Tensor, shape: tuple[int, int]) -> None:
        super().__init__()
        if fmt not in GROUP_FORMATS:
            raise ValueError(f"{fmt}: quantized expert banks need a row-split groupwise format")
        self.format, self.shape = fmt, (int(shape[0]), int(shape[1]))
        self.register_buffer("payload", payload, persistent=False)
        self.qweight: QuantWeight = view_planes(fmt, payload, self.shape)

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]  # nn.Module's own signature
        # ``.to(device)`` and friends replace the payload tensor: the plane views must follow it
        super()._apply(fn, recurse)
        payload = self._buffers["payload"]
        assert payload is not None
        self.qweight = view_planes(self.format, payload, self.shape)
        return self

    def extra_repr(self) -> str:
        return f"{self.format}, shape={list(self.shape)}"


class ExpertScratch:
    """The dense bank (gate_up [E, 2I, H], then down [E, H, I]) that prefill dequantizes one at a time, shared by
    every ``QuantExperts`` of a model: one flat buffer in the model dtype, allocated once (``allocate``) for the
    largest bank. Not a module buffer: a module's ``.to()`` would give each layer its own copy."""

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None
        self.allocations = 0  # how many buffers were ever allocated (1 after a load)

    def allocate(self, numel: int, device: torch.device | str, dtype: torch.dtype) -> None:
        """Hold a buffer of at least ``numel`` elements of ``dtype`` on ``device`` (allocating only when the
        current one is missing, smaller, or elsewhere)."""
        buf, want = self.buffer, torch.device(device)
        if (
            buf is not None
            and buf.numel() >= numel
            and buf.dtype == dtype
            and buf.device.type == want.type
            and want.index in (None, buf.device.index)
        ):
            return
        self.buffer = None  # free the old one first
        # NOTE: a normal tensor even when loading under inference mode: the forward writes it in place, which an
        # inference tensor refuses outside inference mode (a forward under no_grad)
        with torch.inference_mode(False):
            self.buffer = torch.empty(numel, dtype=dtype, device=device)
        self.allocations += 1

    def bank(self, shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """A view ``shape`` of the buffer's start (allocated here only when the model was moved or cast after
        loading): every bank begins at element 0, so each one overwrites the previous."""
        numel = math.prod(shape)
        self.allocate(numel, device, dtype)
        buf = self.buffer
        assert buf is not None
        return buf[:numel].view(shape)

    @property
    def nbytes(self) -> int:
        return 0 if self.buffer is None else self.buffer.numel() * self.buffer.element_size()


def _dequantize_into(qw: QuantWeight, out: torch.Tensor) -> None:
    """``out`` [N, K] (contiguous, the model dtype) = the represented weight, rounded once."""
    if out.dtype in (torch.bfloat16, torch.float16) and use_triton(qw.codes, out):
        dequantize_to(qw, out.dtype, out)
    else:
        out.copy_(dequantize(qw))


class QuantExperts(nn.Module):
    """A MoE layer's routed experts on their quantized banks (see the module docstring); ``gate_up`` [E * 2I, H]
    and ``down`` [E * H, I] are ``QuantBank`` s, ``scratch`` the model's shared ``ExpertScratch``."""

    def __init__(
        self, num_experts: int, hidden: int, inter: int, gate_up: QuantBank, scratch: ExpertScratch
    ) -> None:
        super().__init__()
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden, inter
        expected = (num_experts * 2 * inter, hidden)
        if gate_up.shape != expected:
            raise ValueError(f"routed gate_up {list(gate_up.shape)}: expected [E * 2I, H] = {list(expected)}")
        self.gate_up = gate_up
        self.down: QuantBank | None = None  # bound next (``set_down``): the artifact stores it after gate_up
        self.scratch = scratch

    def set_down(self, down: QuantBank) -> None:
        expected = (self.num_experts * self.hidden_size, self.intermediate_size)
        if down.shape != expected:
            raise ValueError(f"routed down {list(down.shape)}: expected [E * H, I] = {list(expected)}")
        self.down = down

    @property
    def scratch_numel(self) -> int:
        """Elements of the larger dense bank (gate_up [E, 2I, H]) this layer's prefill dequantizes into the
        scratch (down [E, H, I] follows into the same memory)."""
        return 2 * self.num_experts * self.intermediate_size * self.hidden_size

    @property
    def takes_shared_gate(self) -> bool:
        """True (``NINFER_QUANT_MOE_SHARED=fused``, the default): ``SparseMoeBlock`` passes the shared expert's
        output ungated with its gate's weight, and ``forward`` adds the gated term itself."""
        return _dispatch.QUANT_MOE_SHARED == "fused"

    def forward(
        self,
        x: torch.Tensor,
        weights: torch.Tensor,
        expert_ids: torch.Tensor,
        shared: torch.Tensor,
        shared_gate: torch.Tensor | None = None,
    ) -> torch.Tensor:
        down = self.down
        assert down is not None, "QuantExperts: the down bank was never bound"
        few = x.shape[0] <= QUANT_MAX_TOKENS
        if few and _dispatch.QUANT_MOE_SHARED == "fused":
            gate_up = self.gate_up.qweight
            return quant_moe_experts(x, gate_up, down.qweight, weights, expert_ids, shared, shared_gate)
        if shared_gate is not None:  # the block's own ops (``SparseMoeBlock.forward`` with a dense gate)
            shared = torch.sigmoid(linear(x, shared_gate)) * shared
        if few:  # NINFER_QUANT_MOE_SHARED=separate: the gated output added by one more launch
            return quant_moe_experts(x, self.gate_up.qweight, down.qweight, weights, expert_ids) + shared
        if _dispatch.MOE_PREFILL == "quant":  # the grouped GEMM on the quantized banks: no scratch used
            groups = expert_groups(expert_ids, self.num_experts)
            return quant_moe_grouped(
                x, self.gate_up.qweight, down.qweight, weights, expert_ids, groups, shared
            )
        device, dtype = x.device, x.dtype
        return routed_experts(
            x, self.dense_gate_up(device, dtype), lambda: self.dense_down(device, dtype), weights, expert_ids,
            shared,
        )  # fmt: skip

    def dense_gate_up(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The gate_up bank dequantized into the shared scratch: a view [E, 2I, H], valid until the next
        ``dense_*`` call of any layer."""
        e, h, i = self.num_experts, self.hidden_size, self.intermediate_size
        gate_up = self.scratch.bank((e, 2 * i, h), device, dtype)
        _dequantize_into(self.gate_up.qweight, gate_up.view(-1, h))
        return gate_up

    def dense_down(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The down bank dequantized into the shared scratch, over the gate_up bank's memory: a view [E, H, I],
        valid until the next ``dense_*`` call of any layer."""
        down = self.down
        assert down is not None, "QuantExperts: the down bank was never bound"
        e, h, i = self.num_experts, self.hidden_size, self.intermediate_size
        dense = self.scratch.bank((e, h, i), device, dtype)
        _dequantize_into(down.qweight, dense.view(-1, i))
        return dense

    def dequantized(self, dtype: torch.dtype) -> Experts:
        """A dense ``Experts`` holding this layer's exactly dequantized banks in ``dtype`` (own memory): the
        layer's dense twin, for tests and comparisons."""
        down = self.down
        assert down is not None, "QuantExperts: the down bank was never bound"
        e, h, i = self.num_experts, self.hidden_size, self.intermediate_size
        with torch.device("meta"):
            dense = Experts(h, e, i)
        gate_up = dequantize(self.gate_up.qweight).to(dtype).view(e, 2 * i, h)
        dense.gate_up_proj = nn.Parameter(gate_up, requires_grad=False)
        dense.down_proj = nn.Parameter(dequantize(down.qweight).to(dtype).view(e, h, i), requires_grad=False)
        return dense

    def extra_repr(self) -> str:
        return f"experts={self.num_experts}, hidden={self.hidden_size}, inter={self.intermediate_size}"


def quant_experts(model: nn.Module) -> list[QuantExperts]:
    """The model's quantized routed-expert layers (MTP's included), in module order."""
    return [m for m in model.modules() if isinstance(m, QuantExperts)]


def scratch_bytes(model: nn.Module) -> int:
    """Device bytes of the scratch the model's quantized expert layers share (0 without any)."""
    layers = quant_experts(model)
    return layers[0].scratch.nbytes if layers else 0


def allocate_scratch(
    model: nn.Module, device: torch.device | str, dtype: torch.dtype
) -> ExpertScratch | None:
    """Allocate the scratch the model's quantized expert layers share, once, for the largest of them (None when
    the model has none, and under ``NINFER_MOE_PREFILL=quant``, whose prefill never reads it: 1.0 GiB at the
    35B-A3B left to the KV pool; ``ExpertScratch.bank`` would still allocate it on a first scratch-path call).
    Called by the loader after every layer is bound."""
    layers = quant_experts(model)
    if not layers or _dispatch.MOE_PREFILL == "quant":
        return None
    scratch = layers[0].scratch
    assert all(layer.scratch is scratch for layer in layers), "layers with different scratches"
    scratch.allocate(max(layer.scratch_numel for layer in layers), device, dtype)
    return scratch


__all__ = [
    "QUANT_MAX_TOKENS",
    "ExpertScratch",
    "QuantBank",
    "QuantExperts",
    "allocate_scratch",
    "quant_experts",
    "scratch_bytes",
]
