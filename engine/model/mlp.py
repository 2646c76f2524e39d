"""Feed-forward blocks: the dense SiLU-gated MLP and the sparse MoE block with a gated shared expert.

MoE (HF ``Qwen3_5MoeSparseMoeBlock``): ``gate`` is the router ([E, H]); experts are stored fused
(``experts.gate_up_proj`` [E, 2I, H], ``experts.down_proj`` [E, H, I]); the output is the routed sum
plus ``sigmoid(shared_expert_gate(x)) * shared_expert(x)``.

Routing is ``kernels.moe.moe_route`` (one Triton kernel on CUDA, the reference elsewhere). Expert paths
(chosen from shapes and device only, never from the routing, so choosing needs no host sync):

* CUDA, at most ``FUSED_MAX_TOKENS`` tokens (decode, MTP verify, small batches, short prefill chunks):
  ``kernels.moe.moe_experts`` with the shared expert, two Triton GEMV kernels for the whole block (the
  chosen experts' weights read in place, the shared expert a ninth expert weighted by its sigmoid gate,
  fp32 throughout, summed in a fixed order); no host sync (CUDA-graph safe), and each token's math
  independent of the batch (``NINFER_KERNELS=ref``: its reference, which syncs);
* CUDA, more tokens (prefill): rows grouped by expert, each expert's rows one matmul in the model dtype
  (``_experts_grouped``; syncs once for the counts), the shared expert as its own MLP;
* CPU, ``T * top_k <= GATHER_MAX_ROWS``: gather the chosen experts' weights and run two batched matmuls
  (each row's math independent of the batch); CPU, more: ``moe_experts_ref``; the shared expert as its
  own MLP, in the model dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.config import ModelConfig
from kernels.moe import SharedExpert, moe_experts, moe_experts_ref, moe_route

FUSED_MAX_TOKENS = 64  # CUDA: T at or below this takes the fused Triton experts
GATHER_MAX_ROWS = 64  # CPU: T * top_k at or below this takes the gathered-weights path


class MLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    """``mlp.gate.weight`` [E, H]: router logits."""

    def __init__(self, hidden_size: int, num_experts: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_experts, hidden_size), requires_grad=False)


class Experts(nn.Module):
    def __init__(self, hidden_size: int, num_experts: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(
            torch.zeros(num_experts, 2 * intermediate_size, hidden_size), requires_grad=False
        )
        self.down_proj = nn.Parameter(
            torch.zeros(num_experts, hidden_size, intermediate_size), requires_grad=False
        )


class SparseMoeBlock(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.top_k = config.num_experts_per_tok
        self.gate = Router(hidden, config.num_experts)
        self.experts = Experts(hidden, config.num_experts, config.moe_intermediate_size)
        self.shared_expert = MLP(hidden, config.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(hidden, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, expert_ids = moe_route(F.linear(x, self.gate.weight), self.top_k)
        gate_up, down = self.experts.gate_up_proj, self.experts.down_proj
        if x.is_cuda and x.shape[0] <= FUSED_MAX_TOKENS:
            return moe_experts(x, gate_up, down, weights, expert_ids, self.shared_weights())
        if x.is_cuda:
            routed = _experts_grouped(x, gate_up, down, weights, expert_ids)
        elif expert_ids.numel() <= GATHER_MAX_ROWS:
            routed = _experts_gathered(x, gate_up, down, weights, expert_ids)
        else:
            routed = moe_experts_ref(x, gate_up, down, weights, expert_ids)
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return routed + shared

    def shared_weights(self) -> SharedExpert:
        """The shared expert's parameters as ``kernels.moe.moe_experts`` takes them (the tensors themselves)."""
        mlp = self.shared_expert
        return SharedExpert(
            mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight, self.shared_expert_gate.weight
        )


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


def _experts_grouped(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    weights: torch.Tensor,
    expert_ids: torch.Tensor,
) -> torch.Tensor:
    """``moe_experts_ref`` for a large batch on CUDA: rows sorted by expert, each expert's rows padded to
    a multiple of ``_GROUP_ALIGN`` and run as one grouped GEMM (``torch._grouped_mm``) in the model
    dtype; one matmul per expert where the grouped GEMM is unavailable. Syncs once for the counts."""
    num_experts = gate_up.shape[0]
    top_k = expert_ids.shape[1]
    flat = expert_ids.reshape(-1)
    order = flat.argsort(stable=True)
    token_of = order // top_k
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    xs = x[token_of]
    if _grouped_mm_ok(x, gate_up):
        ys = _grouped_rows(xs, flat[order], counts, gate_up, down)
    else:
        ys = torch.empty(xs.shape, dtype=torch.float32, device=x.device)
        start = 0
        for expert, count in enumerate(counts):
            if count:
                rows = slice(start, start + count)
                gate, up = (xs[rows] @ gate_up[expert].t()).chunk(2, dim=-1)
                act = (F.silu(gate.float()) * up.float()).to(x.dtype)
                ys[rows] = (act @ down[expert].t()).float()
                start += count
    ys = ys * weights.reshape(-1)[order].float().unsqueeze(-1)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    out.index_add_(0, token_of, ys)
    return out.to(x.dtype)


_GROUP_ALIGN = 16  # rows per expert group padded to this (grouped-GEMM alignment)


def _grouped_mm_ok(x: torch.Tensor, gate_up: torch.Tensor) -> bool:
    return (
        hasattr(torch, "_grouped_mm")
        and x.is_cuda
        and x.dtype == torch.bfloat16
        and torch.cuda.get_device_capability(x.device) >= (9, 0)
        and x.shape[-1] % 16 == 0
        and gate_up.shape[1] % 32 == 0
    )


def _grouped_rows(
    xs: torch.Tensor,
    sorted_experts: torch.Tensor,
    counts: list[int],
    gate_up: torch.Tensor,
    down: torch.Tensor,
) -> torch.Tensor:
    """Expert MLP of rows already sorted by expert -> fp32 [rows, H], through two grouped GEMMs."""
    padded = [-(-c // _GROUP_ALIGN) * _GROUP_ALIGN for c in counts]
    ends, starts, src_starts = [], [], []
    total = src = 0
    for count, size in zip(counts, padded, strict=True):
        starts.append(total)
        src_starts.append(src)
        total += size
        src += count
        ends.append(total)
    device = xs.device
    dest = (
        torch.tensor(starts, device=device)[sorted_experts]
        + torch.arange(xs.shape[0], device=device)
        - torch.tensor(src_starts, device=device)[sorted_experts]
    )
    offs = torch.tensor(ends, dtype=torch.int32, device=device)
    grouped = xs.new_zeros(max(total, _GROUP_ALIGN), xs.shape[-1])
    grouped[dest] = xs
    gate_up_out = torch._grouped_mm(grouped, gate_up.transpose(1, 2), offs=offs)
    gate, up = gate_up_out.chunk(2, dim=-1)
    act = (F.silu(gate.float()) * up.float()).to(xs.dtype)
    return torch._grouped_mm(act, down.transpose(1, 2), offs=offs)[dest].float()


def make_feed_forward(config: ModelConfig) -> nn.Module:
    """The model's feed-forward block: MoE for the MoE model, dense MLP otherwise."""
    if config.is_moe:
        return SparseMoeBlock(config)
    assert config.intermediate_size is not None
    return MLP(config.hidden_size, config.intermediate_size)
