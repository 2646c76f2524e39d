"""The MoE prefill path (engine/model/mlp.py ``_experts_grouped``) on the CPU: the grouping's index math
(``expert_groups``: padded groups, each pair's row, each row's token), the whole path with
``_grouped_mm_loop`` (and CPU ``torch._grouped_mm`` where this torch has it) standing in for the CUDA grouped
GEMM against ``moe_experts_ref`` + the shared expert as ``SparseMoeBlock`` computes them, padded rows never
read, and no host sync (the path runs on meta tensors, which have no data to read back). One GPU test
runs it on CUDA under ``torch.cuda.set_sync_debug_mode("error")``."""

from __future__ import annotations

import pytest
import torch

import engine.model.mlp as mlp
import kernels.moe
from engine.model.config import ModelConfig
from engine.model.mlp import (
    _GROUP_ALIGN,
    SparseMoeBlock,
    _experts_grouped,
    _grouped_mm_loop,
    _padded_rows_bound,
    expert_groups,
)
from kernels.moe import moe_combine_ref, moe_experts_ref, moe_route_ref


def _routing(
    tokens: int, experts: int, top_k: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    return moe_route_ref(torch.randn(tokens, experts, generator=gen), top_k)


# (tokens, experts, top_k, how): random routings (most experts empty at T=1 and T=5), T not a multiple of
# anything, every token on the same experts, one expert for every pair (top_k 1), counts of 17 per expert
# (the bound's worst case: every group pads 15 rows)
ROUTINGS = [
    (1, 256, 8, "random"),
    (5, 64, 2, "random"),
    (37, 16, 3, "random"),
    (101, 256, 8, "random"),
    (23, 10, 3, "same experts"),
    (40, 7, 1, "one expert"),
    (17, 16, 16, "worst padding"),
]


def _ids(tokens: int, experts: int, top_k: int, how: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(tokens * 31 + experts)
    if how == "random":
        return _routing(tokens, experts, top_k, gen)[1]
    if how == "same experts":
        return torch.tensor([[7, 2, 9]]).expand(tokens, 3).contiguous()
    if how == "one expert":
        return torch.full((tokens, 1), 4)
    return torch.stack([torch.randperm(experts, generator=gen) for _ in range(tokens)])


@pytest.mark.parametrize(("tokens", "experts", "top_k", "how"), ROUTINGS)
def test_groups_put_every_pair_in_its_experts_padded_group(
    tokens: int, experts: int, top_k: int, how: str
) -> None:
    ids = _ids(tokens, experts, top_k, how)
    groups = expert_groups(ids, experts)
    bound = _padded_rows_bound(tokens * top_k, experts)
    assert groups.offs.dtype == torch.int32 and groups.offs.shape == (experts,)
    assert groups.token_idx.shape == (bound,) and groups.row_idx.shape == (tokens, top_k)
    ends = groups.offs.long()
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    counts = torch.bincount(ids.reshape(-1), minlength=experts)
    sizes = ends - starts
    assert torch.equal(sizes, (counts + _GROUP_ALIGN - 1) // _GROUP_ALIGN * _GROUP_ALIGN), (
        "padded group sizes"
    )
    assert int(ends[-1]) <= bound
    rows = groups.row_idx.reshape(-1)
    assert rows.unique().numel() == rows.numel(), "two pairs share a row"
    expert_of_pair = ids.reshape(-1)
    assert bool(((rows >= starts[expert_of_pair]) & (rows < ends[expert_of_pair])).all()), (
        "pair outside its group"
    )
    # each group's real rows come first (then its padding), in token order
    for expert in range(experts):
        own = rows[expert_of_pair == expert]
        assert torch.equal(own, torch.arange(int(starts[expert]), int(starts[expert]) + own.numel())), expert
    token_of_pair = torch.arange(tokens).repeat_interleave(top_k)
    assert torch.equal(groups.token_idx[rows], token_of_pair), "a pair's row is not filled from its token"
    padding = torch.ones(bound, dtype=torch.bool)
    padding[rows] = False
    assert bool((groups.token_idx[padding] == 0).all()), "padding rows must copy token 0 (finite inputs)"


def test_bound_is_reached_by_the_worst_routing() -> None:
    """17 pairs on each of 16 experts: every group pads 15 rows, the buffer is full to the bound."""
    ids = _ids(17, 16, 16, "worst padding")
    groups = expert_groups(ids, 16)
    assert int(groups.offs[-1]) == _padded_rows_bound(17 * 16, 16) == 17 * 16 + 16 * 15
    assert _padded_rows_bound(8, 256) == 128  # few pairs: at most one group per pair pads
    assert _padded_rows_bound(61440, 256) == 61440 + 256 * 15  # the 35B-A3B prefill of 7680 tokens


def _experts(
    experts: int, hidden: int, inter: int, dtype: torch.dtype, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=gen) * hidden**-0.5
    down = torch.randn(experts, hidden, inter, generator=gen) * inter**-0.5
    return gate_up.to(dtype), down.to(dtype)


def _rel_rms(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.double(), expected.double()
    return ((actual - expected).pow(2).mean().sqrt() / expected.pow(2).mean().sqrt()).item()


# fp32: summation order only; bf16: the GEMMs' and the activation's roundings (the GPU test of the old path
# allowed 1e-2 against the fp32 reference)
LIMIT = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


@pytest.mark.parametrize(("tokens", "experts", "top_k", "how"), ROUTINGS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_matches_the_reference(
    tokens: int, experts: int, top_k: int, how: str, dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(3)
    hidden, inter = 48, 24
    x = torch.randn(tokens, hidden, generator=gen).to(dtype)
    gate_up, down = _experts(experts, hidden, inter, dtype, gen)
    ids = _ids(tokens, experts, top_k, how)
    weights = torch.rand(tokens, top_k, generator=gen)
    shared = torch.randn(tokens, hidden, generator=gen).to(dtype)
    out = _experts_grouped(x, gate_up, down, weights, ids, shared)
    assert out.dtype == dtype and out.shape == x.shape
    expected = moe_experts_ref(x.float(), gate_up.float(), down.float(), weights, ids) + shared.float()
    assert _rel_rms(out, expected) < LIMIT[dtype]
    routed = _experts_grouped(x, gate_up, down, weights, ids)
    assert _rel_rms(routed, expected - shared.float()) < LIMIT[dtype]


@pytest.mark.parametrize(("tokens", "experts", "top_k", "how"), ROUTINGS[1:4])
def test_torch_grouped_mm_agrees_with_the_loop(
    tokens: int, experts: int, top_k: int, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real op (its CPU fallback) reads the same offs contract as ``_grouped_mm_loop``: group ends, rows
    past ``offs[-1]`` ignored."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(tokens, 32, generator=gen).bfloat16()
    gate_up, down = _experts(experts, 32, 16, torch.bfloat16, gen)
    ids = _ids(tokens, experts, top_k, how)
    weights = torch.rand(tokens, top_k, generator=gen)
    looped = _experts_grouped(x, gate_up, down, weights, ids)
    monkeypatch.setattr(mlp, "_grouped_mm_ok", lambda x, gate_up: True)
    assert torch.equal(_experts_grouped(x, gate_up, down, weights, ids), looped)


def test_padded_rows_are_never_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every row of either GEMM's output that holds no pair (group padding, rows past offs[-1]) set to NaN:
    the result is unchanged."""
    gen = torch.Generator().manual_seed(5)
    tokens, experts, top_k, hidden, inter = 29, 12, 3, 40, 20
    x = torch.randn(tokens, hidden, generator=gen)
    gate_up, down = _experts(experts, hidden, inter, torch.float32, gen)
    weights, ids = _routing(tokens, experts, top_k, gen)
    shared = torch.randn(tokens, hidden, generator=gen)
    clean = _experts_grouped(x, gate_up, down, weights, ids, shared)
    used = torch.zeros(_padded_rows_bound(tokens * top_k, experts), dtype=torch.bool)
    used[expert_groups(ids, experts).row_idx.reshape(-1)] = True
    assert not bool(used.all()), "the case must have padding rows"

    def poisoned(a: torch.Tensor, b: torch.Tensor, *, offs: torch.Tensor) -> torch.Tensor:
        out = _grouped_mm_loop(a, b, offs=offs)
        out[~used] = float("nan")
        return out

    monkeypatch.setattr(mlp, "_grouped_mm_loop", poisoned)
    out = _experts_grouped(x, gate_up, down, weights, ids, shared)
    assert torch.equal(out, clean)


def test_no_host_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    """The grouped-GEMM path on meta tensors (shapes without data): any value read back to the host
    (``.tolist()``, ``.item()``, ``torch.bincount``'s size) would raise, so every shape is a function of T,
    top_k and E alone."""
    monkeypatch.setattr(mlp, "_grouped_mm_ok", lambda x, gate_up: True)
    monkeypatch.setattr(kernels.moe, "use_triton", lambda *tensors: False)  # the references on meta
    monkeypatch.setattr("kernels.activation.use_triton", lambda *tensors: False)
    tokens, experts, top_k, hidden, inter = 7680, 256, 8, 2048, 512
    meta = dict(device="meta", dtype=torch.bfloat16)
    x, shared = torch.empty(tokens, hidden, **meta), torch.empty(tokens, hidden, **meta)
    gate_up, down = (
        torch.empty(experts, 2 * inter, hidden, **meta),
        torch.empty(experts, hidden, inter, **meta),
    )
    weights = torch.empty(tokens, top_k, device="meta")
    ids = torch.empty(tokens, top_k, dtype=torch.int64, device="meta")
    out = _experts_grouped(x, gate_up, down, weights, ids, shared)
    assert out.shape == (tokens, hidden) and out.dtype == torch.bfloat16
    groups = expert_groups(ids, experts)
    assert groups.token_idx.shape == (tokens * top_k + experts * (_GROUP_ALIGN - 1),)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_the_cpu_block(dtype: torch.dtype) -> None:
    """``_experts_grouped`` with the shared expert's output (what ``SparseMoeBlock.forward`` runs on CUDA for
    more than FUSED_MAX_TOKENS tokens) against the block's own CPU forward (routed reference + shared)."""
    config = ModelConfig(
        model_type="qwen3_5_moe_text", vocab_size=100, hidden_size=64, num_hidden_layers=1,
        layer_types=("linear_attention",), num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        rms_norm_eps=1e-6, rope_theta=1e4, partial_rotary_factor=0.25, mrope_section=None,
        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=1,
        linear_num_value_heads=2, num_experts=20, num_experts_per_tok=4, moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
    )  # fmt: skip
    block = SparseMoeBlock(config).eval()
    gen = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
    block = block.to(dtype)
    x = torch.randn(45, 64, generator=gen).to(dtype)  # 45 x 4 pairs > GATHER_MAX_ROWS: the reference path
    with torch.no_grad():
        expected = block(x)
        weights, ids = moe_route_ref(torch.nn.functional.linear(x, block.gate.weight), block.top_k)
        shared = torch.sigmoid(block.shared_expert_gate(x)) * block.shared_expert(x)
        out = _experts_grouped(x, block.experts.gate_up_proj, block.experts.down_proj, weights, ids, shared)
    assert _rel_rms(out, expected) < LIMIT[dtype]


def test_combine_reference_is_the_weighted_sum_of_the_named_rows() -> None:
    gen = torch.Generator().manual_seed(7)
    expert_out = torch.randn(50, 12, generator=gen)
    rows = torch.randperm(50, generator=gen)[:21].view(7, 3)
    weights = torch.rand(7, 3, generator=gen)
    shared = torch.randn(7, 12, generator=gen)
    expected = torch.stack([sum(weights[t, k] * expert_out[rows[t, k]] for k in range(3)) for t in range(7)])
    torch.testing.assert_close(moe_combine_ref(expert_out, rows, weights), expected)
    torch.testing.assert_close(moe_combine_ref(expert_out, rows, weights, shared), expected + shared)
    assert moe_combine_ref(expert_out.bfloat16(), rows, weights, shared.bfloat16()).dtype == torch.bfloat16
