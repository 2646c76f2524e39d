"""Feed-forward blocks: the dense SiLU-gated MLP and the sparse MoE block with a gated shared expert.

MoE (HF ``Qwen3_5MoeSparseMoeBlock``): ``gate`` is the router ([E, H]); experts are stored fused
(``experts.gate_up_proj`` [E, 2I, H], ``experts.down_proj`` [E, H, I]); the output is the routed sum
plus ``sigmoid(shared_expert_gate(x)) * shared_expert(x)``. ``experts`` is a dense ``Experts`` or, for a
groupwise-int artifact, ``engine.model.quant_experts.QuantExperts`` (the banks kept quantized); either is called
``experts(x, weights, expert_ids, shared)`` and returns the routed sum plus ``shared``. Experts that take the
shared gate (``takes_shared_gate``: ``QuantExperts``) are called ``experts(x, weights, expert_ids, shared_out,
score)`` instead when the gate is dense (score: its weight [1, H]; shared_out ungated): they add
``sigmoid(score . x) * shared_out`` themselves. The paths below are the dense ones (``routed_experts``);
``QuantExperts`` streams its banks for few tokens (the gated shared term inside its down kernel) and, for more,
dequantizes them into a shared scratch and takes these.

Routing is ``kernels.moe_router.moe_router`` (a dense router weight): under ``NINFER_MOE_ROUTER=fused``, for 1..8
tokens on CUDA, the router GEMV and the softmax top-k in one Triton launch; otherwise the router linear then
``kernels.moe.moe_route`` (one Triton kernel on CUDA, the reference elsewhere). Expert paths
(chosen from shapes and device only, never from the routing, so choosing needs no host sync):

* CUDA, at most ``FUSED_MAX_TOKENS`` tokens (decode, MTP verify, small batches, short prefill chunks):
  ``kernels.moe.moe_experts`` with the shared expert, two Triton GEMV kernels for the whole block (the
  chosen experts' weights read in place, the shared expert a ninth expert weighted by its sigmoid gate,
  fp32 throughout, summed in a fixed order); no host sync (CUDA-graph safe), and each token's math
  independent of the batch (``NINFER_KERNELS=ref``: its reference, which syncs);
* CUDA, more tokens (prefill): ``_experts_grouped``, no host sync: the (token, expert) pairs' rows sorted
  by expert into a padded buffer whose size is known from the shapes alone, two grouped GEMMs in the model
  dtype, ``kernels.activation.silu_mul`` between them, and ``kernels.moe.moe_combine`` summing each
  token's rows with the shared expert (its own MLP, computed first);
* CPU, ``T * top_k <= GATHER_MAX_ROWS``: gather the chosen experts' weights and run two batched matmuls
  (each row's math independent of the batch); CPU, more: ``moe_experts_ref``'s arithmetic in two passes
  (``_experts_by_expert``: every act, then the down projections); the shared expert as its own MLP, in the
  model dtype.

On the many-token paths the down bank may be deferred (``routed_experts``'s ``down`` a function, called after
the last read of gate_up): ``QuantExperts`` dequantizes both banks into one scratch region, one after the other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.config import ModelConfig
from engine.model.fusion import concat_linears
from engine.model.linear import DenseMethod, Linear, bound_inputs
from kernels.activation import silu_mul
from kernels.moe import SharedExpert, moe_combine, moe_experts, moe_route
from kernels.moe_router import moe_router

FUSED_MAX_TOKENS = 64  # CUDA: T at or below this takes the fused Triton experts
GATHER_MAX_ROWS = 64  # CPU: T * top_k at or below this takes the gathered-weights path
_GATE_UP = (("gate",), ("up",))  # what an MLP reads from its input projections


class MLP(nn.Module):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))``. ``fuse_projections()`` (once, after loading) replaces
    gate_proj and up_proj by one ``gate_up_proj`` [2I, H] (gate rows, then up rows): one GEMM, whose two
    halves ``silu_mul`` reads in place (strided views, no copy). The input projections are named by
    ``input_projections`` (a quantized artifact's stored ``mlp/gate_up`` parent becomes ``gate_up_proj``)."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gate_proj = Linear(hidden_size, intermediate_size, [("gate", intermediate_size)])
        self.up_proj = Linear(hidden_size, intermediate_size, [("up", intermediate_size)])
        self.gate_up_proj: Linear | None = None  # gate_proj | up_proj once fused
        self.input_projections: tuple[str, ...] = ("gate_proj", "up_proj")
        self.down_proj = Linear(intermediate_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = bound_inputs(self, _GATE_UP).run(x)
        return self.down_proj(silu_mul(gate, up))

    def gate_up_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate [I, H], up [I, H]) dense weights: the parameters themselves, or once fused the two row halves
        of ``gate_up_proj.weight`` (views: unit stride along H, row stride H, no copy)."""
        if self.gate_up_proj is None:
            assert self.gate_proj.weight is not None and self.up_proj.weight is not None
            return self.gate_proj.weight, self.up_proj.weight
        assert self.gate_up_proj.weight is not None, (
            "gate_up_weights: a quantized gate_up has no dense weight"
        )
        gate, up = self.gate_up_proj.weight.split_with_sizes([self.intermediate_size] * 2, dim=0)
        return gate, up

    def fuse_projections(self) -> bool:
        """Replace gate_proj and up_proj by one ``gate_up_proj`` (their weights concatenated, the originals
        dropped). Returns False (and changes nothing) when already fused."""
        if self.input_projections != ("gate_proj", "up_proj"):
            return False
        self.gate_up_proj = concat_linears(self.gate_proj, self.up_proj)
        del self.gate_proj, self.up_proj
        self.input_projections = ("gate_up_proj",)
        return True


class Router(Linear):
    """``mlp.gate.weight`` [E, H]: router logits."""

    def __init__(self, hidden_size: int, num_experts: int) -> None:
        super().__init__(hidden_size, num_experts, [("router", num_experts)])


class Experts(nn.Module):
    """Dense routed experts: ``gate_up_proj`` [E, 2I, H], ``down_proj`` [E, H, I] in the model dtype.
    ``forward(x, weights, expert_ids, shared)``: the routed sum plus ``shared`` (``routed_experts``); a quantized
    artifact's experts (``engine.model.quant_experts.QuantExperts``) keep the same call."""

    def __init__(self, hidden_size: int, num_experts: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(
            torch.zeros(num_experts, 2 * intermediate_size, hidden_size), requires_grad=False
        )
        self.down_proj = nn.Parameter(
            torch.zeros(num_experts, hidden_size, intermediate_size), requires_grad=False
        )

    def forward(
        self, x: torch.Tensor, weights: torch.Tensor, expert_ids: torch.Tensor, shared: torch.Tensor
    ) -> torch.Tensor:
        return routed_experts(x, self.gate_up_proj, self.down_proj, weights, expert_ids, shared)


class SparseMoeBlock(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.top_k = config.num_experts_per_tok
        self.gate = Router(hidden, config.num_experts)
        # dense ``Experts``, or ``QuantExperts`` (a groupwise-int artifact's banks, bound by the profile loader)
        self.experts: nn.Module = Experts(hidden, config.num_experts, config.moe_intermediate_size)
        self.shared_expert = MLP(hidden, config.shared_expert_intermediate_size)
        self.shared_expert_gate = Linear(hidden, 1, [("shared_gate", 1)])

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, top_k] fp32, expert_ids [T, top_k] int64): ``moe_router`` on a dense router weight (one
        launch at decode under ``NINFER_MOE_ROUTER=fused``), the router layer then ``moe_route`` otherwise."""
        gate = self.gate
        if gate.weight is not None and isinstance(gate.method, DenseMethod):
            return moe_router(x, gate.weight, self.top_k)
        return moe_route(gate(x), self.top_k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, expert_ids = self.route(x)
        experts = self.experts
        fused = x.is_cuda and x.shape[0] <= FUSED_MAX_TOKENS
        if fused and isinstance(experts, Experts) and self.shared_is_dense():
            return moe_experts(
                x, experts.gate_up_proj, experts.down_proj, weights, expert_ids, self.shared_weights()
            )
        score = self.dense_shared_gate()
        if score is not None and getattr(experts, "takes_shared_gate", False):
            # quantized experts: the shared expert's output goes in ungated, its gate and the sum are theirs
            # (at decode inside their down kernel: no gate GEMV, sigmoid, product or add launch)
            gated: torch.Tensor = experts(x, weights, expert_ids, self.shared_expert.forward(x), score)
            return gated
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert.forward(x)
        out: torch.Tensor = experts(x, weights, expert_ids, shared)
        return out

    def dense_shared_gate(self) -> torch.Tensor | None:
        """``shared_expert_gate``'s dense weight [1, H] (None when it is quantized)."""
        gate = self.shared_expert_gate
        return gate.weight if gate.weight is not None and isinstance(gate.method, DenseMethod) else None

    def shared_is_dense(self) -> bool:
        """True when the shared expert and its gate hold dense weights (what ``moe_experts`` fuses in)."""
        shared = self.shared_expert
        if self.shared_expert_gate.weight is None or shared.down_proj.weight is None:
            return False
        return all(layer.weight is not None for layer in bound_inputs(shared, _GATE_UP).layers)

    def shared_weights(self) -> SharedExpert:
        """The shared expert's parameters as ``kernels.moe.moe_experts`` takes them (the tensors themselves;
        gate and up once fused: the two row halves of ``shared_expert.gate_up_proj.weight``, views)."""
        gate, up = self.shared_expert.gate_up_weights()
        down, score = self.shared_expert.down_proj.weight, self.shared_expert_gate.weight
        assert down is not None and score is not None, "shared_weights: the shared expert is not dense"
        return SharedExpert(gate, up, down, score)


Bank = torch.Tensor | Callable[[], torch.Tensor]  # a down bank, or what produces it once gate_up is read


def routed_experts(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: Bank,
    weights: torch.Tensor,
    expert_ids: torch.Tensor,
    shared: torch.Tensor,
) -> torch.Tensor:
    """The routed sum on dense banks (gate_up [E, 2I, H], down [E, H, I]) plus ``shared`` [T, H], by the paths of
    the module docstring (the shared expert already computed: a quantized one runs as its own MLP).

    ``down`` may be a function returning the bank, for more than ``FUSED_MAX_TOKENS`` tokens: it is called once,
    after the last read of gate_up (``QuantExperts`` dequantizes down into the memory gate_up held)."""
    if callable(down):
        assert x.shape[0] > FUSED_MAX_TOKENS, "a deferred down bank needs the many-token paths"
    elif x.is_cuda and x.shape[0] <= FUSED_MAX_TOKENS:
        return moe_experts(x, gate_up, down, weights, expert_ids) + shared
    elif expert_ids.numel() <= GATHER_MAX_ROWS and not x.is_cuda:
        return _experts_gathered(x, gate_up, down, weights, expert_ids) + shared
    if x.is_cuda:  # the shared output joins the routed sum inside moe_combine
        return _experts_grouped(x, gate_up, down, weights, expert_ids, shared)
    return _experts_by_expert(x, gate_up, down, weights, expert_ids) + shared


def _experts_by_expert(
    x: torch.Tensor, gate_up: torch.Tensor, down: Bank, weights: torch.Tensor, expert_ids: torch.Tensor
) -> torch.Tensor:
    """``kernels.moe.moe_experts_ref``'s arithmetic (bitwise: the same products, summed in the same order) in two
    passes, for many tokens on the CPU: every chosen expert's act first (the last read of gate_up), then ``down``
    (called now when deferred) against them."""
    acts = []
    for expert in expert_ids.unique().tolist():
        token_idx, k_idx = (expert_ids == expert).nonzero(as_tuple=True)
        gate, up = (x[token_idx].float() @ gate_up[expert].float().t()).chunk(2, dim=-1)
        acts.append((expert, token_idx, k_idx, F.silu(gate) * up))
    down = down() if callable(down) else down
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for expert, token_idx, k_idx, act in acts:
        ye = act @ down[expert].float().t()
        out.index_add_(0, token_idx, ye * weights[token_idx, k_idx, None].float())
    return out.to(x.dtype)


def _experts_gathered(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    weights: torch.Tensor,
    expert_ids: torch.Tensor,
) -> torch.Tensor:
    """``moe_experts_ref`` for few tokens on the CPU: gather the chosen experts' weights, two batched
    matmuls (on CUDA ``moe_experts`` reads the weights in place instead of copying them first)."""
    num_tokens, top_k = expert_ids.shape
    flat = expert_ids.reshape(-1)
    xs = x.unsqueeze(1).expand(-1, top_k, -1).reshape(-1, x.shape[-1], 1)  # [T * k, H, 1]
    gate, up = torch.bmm(gate_up[flat], xs).squeeze(-1).chunk(2, dim=-1)  # [T * k, I] each
    act = (F.silu(gate.float()) * up.float()).to(x.dtype).unsqueeze(-1)
    ys = torch.bmm(down[flat], act).squeeze(-1).float()  # [T * k, H]
    out = (ys.view(num_tokens, top_k, -1) * weights.float().unsqueeze(-1)).sum(dim=1)
    return out.to(x.dtype)


_GROUP_ALIGN = 16  # rows per expert group padded to this (grouped-GEMM alignment)


class ExpertGroups(NamedTuple):
    """Where ``_experts_grouped`` puts the (token, slot) pairs: their rows sorted by expert (stable: token
    order within an expert), each expert's group padded to a multiple of ``_GROUP_ALIGN`` rows, in a buffer
    of ``_padded_rows_bound(T * top_k, E)`` rows, a size known from the shapes alone::

        | e0 rows | pad | e1 rows | pad | (e2: none) | ... | e(E-1) rows | pad | unused (not computed) |
        0               offs[0]         offs[1] = offs[2]                     offs[E-1]                bound

    Padding rows copy token 0 (finite inputs); their outputs, and the rows past ``offs[-1]``, are never read.
    """

    offs: torch.Tensor  # [E] int32: each expert's group end (torch._grouped_mm's offs)
    token_idx: torch.Tensor  # [bound] int64: the token whose x fills each row (0 for padding and unused rows)
    row_idx: torch.Tensor  # [T, top_k] int64: the row that holds each (token, slot) pair


def _padded_rows_bound(num_pairs: int, num_experts: int) -> int:
    """Rows enough for any routing: at most min(E, pairs) groups are non-empty and each pads fewer than
    ``_GROUP_ALIGN`` rows; rounded up to ``_GROUP_ALIGN``."""
    bound = num_pairs + min(num_experts, num_pairs) * (_GROUP_ALIGN - 1)
    return -(-bound // _GROUP_ALIGN) * _GROUP_ALIGN


def expert_groups(expert_ids: torch.Tensor, num_experts: int) -> ExpertGroups:
    """``ExpertGroups`` for a routing (expert_ids [T, top_k]), all on its device: nothing is read back, so
    no host sync (the counts come from the sorted ids, not ``torch.bincount``, whose CUDA kernel reads the
    largest id back to size its output)."""
    num_tokens, top_k = expert_ids.shape
    device = expert_ids.device
    flat = expert_ids.reshape(-1)
    sorted_experts, order = flat.sort(stable=True)  # sorted position j holds pair order[j]
    experts = torch.arange(num_experts + 1, dtype=sorted_experts.dtype, device=device)
    starts = torch.searchsorted(sorted_experts, experts)  # [E + 1]: each expert's first sorted position
    sizes = (starts.diff() + _GROUP_ALIGN - 1) // _GROUP_ALIGN * _GROUP_ALIGN  # [E]: padded group sizes
    ends = sizes.cumsum(0)
    # sorted position j of expert e goes to row (its group's start) + (j - starts[e])
    shift = ends - sizes - starts[:-1]
    dest = shift[sorted_experts] + torch.arange(flat.numel(), device=device)
    row_idx = torch.empty_like(dest).scatter_(0, order, dest)
    bound = _padded_rows_bound(flat.numel(), num_experts)
    token_idx = torch.zeros(bound, dtype=torch.int64, device=device).scatter_(0, dest, order // top_k)
    return ExpertGroups(ends.to(torch.int32), token_idx, row_idx.view(num_tokens, top_k))


def _experts_grouped(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: Bank,
    weights: torch.Tensor,
    expert_ids: torch.Tensor,
    shared: torch.Tensor | None = None,
) -> torch.Tensor:
    """``moe_experts_ref`` (+ ``shared``, the gated shared expert's output [T, H], when given) for a large
    batch: the pairs' rows grouped by expert (``ExpertGroups``), two grouped GEMMs in the model dtype
    (``torch._grouped_mm``; ``_grouped_mm_loop`` where it is unavailable, which syncs), the activation and
    the weighted per-token sum in fp32 (``silu_mul``, ``moe_combine``). No host sync on the grouped-GEMM
    path: every shape comes from T, top_k and E.

    The input rows are one gather of x straight into the padded layout (write R x H, read x's rows, mostly
    L2 hits): a gather in pair order followed by a zero fill and an ``index_put``/``index_copy_`` into the
    padded buffer would write the rows twice more and read them once more. The output side never builds an
    fp32 [T * top_k, H] tensor: ``moe_combine`` reads each token's top_k bf16 rows once. A deferred ``down`` is
    called between the two GEMMs (stream order: after the gate_up GEMM's reads).
    """
    groups = expert_groups(expert_ids, gate_up.shape[0])
    grouped_mm: Callable[..., torch.Tensor] = (
        torch._grouped_mm if _grouped_mm_ok(x, gate_up) else _grouped_mm_loop
    )
    rows = x.index_select(0, groups.token_idx)  # [R, H]
    gate, up = grouped_mm(rows, gate_up.transpose(1, 2), offs=groups.offs).chunk(2, dim=-1)  # [R, I] each
    act = silu_mul(gate, up)
    down = down() if callable(down) else down
    expert_out = grouped_mm(act, down.transpose(1, 2), offs=groups.offs)  # [R, H]
    return moe_combine(expert_out, groups.row_idx, weights, shared)


def _grouped_mm_ok(x: torch.Tensor, gate_up: torch.Tensor) -> bool:
    return (
        hasattr(torch, "_grouped_mm")
        and x.is_cuda
        and x.dtype == torch.bfloat16
        and torch.cuda.get_device_capability(x.device) >= (9, 0)
        and x.shape[-1] % 16 == 0
        and gate_up.shape[1] % 32 == 0
    )


def _grouped_mm_loop(a: torch.Tensor, b: torch.Tensor, *, offs: torch.Tensor) -> torch.Tensor:
    """``torch._grouped_mm(a, b, offs=offs)`` for a [M, K] and b [G, K, N]: rows ``offs[g-1]:offs[g]`` times
    ``b[g]``, one matmul per group (reads offs back: one host sync); rows past ``offs[-1]`` are left
    unwritten, as there."""
    out = a.new_empty(a.shape[0], b.shape[-1])
    start = 0
    for group, end in enumerate(offs.tolist()):
        if end > start:
            out[start:end] = a[start:end] @ b[group]
        start = end
    return out


def make_feed_forward(config: ModelConfig) -> nn.Module:
    """The model's feed-forward block: MoE for the MoE model, dense MLP otherwise."""
    if config.is_moe:
        return SparseMoeBlock(config)
    assert config.intermediate_size is not None
    return MLP(config.hidden_size, config.intermediate_size)
