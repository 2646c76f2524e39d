"""Triton MoE launchers vs their references: routing (softmax, top-k, renormalise), the routed experts
(gate_up GEMV, SiLU, down GEMV, weighted sum) and the whole block's experts (routed + the gated shared expert
in the same two kernels), odd sizes, batch invariance (bitwise), experts shared across tokens, CUDA-graph
replay; the prefill combine (each token's weighted expert-output rows + the shared expert's output) vs its
reference, the rows no pair names never read (GPU; or CPU under TRITON_INTERPRET=1 for everything but the
real geometry)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.moe import (
    SharedExpert,
    moe_combine,
    moe_combine_ref,
    moe_experts,
    moe_experts_ref,
    moe_route,
    moe_route_ref,
)

pytestmark = pytest.mark.gpu

# bf16 output: kernel and reference both accumulate in fp32 and differ by an output rounding (rel RMS ~1e-3
# on the GPU; Triton 3.6's interpreter truncates fp32 -> bf16 instead of rounding, ~4e-3); fp32: the
# accumulation order only (~3e-7).
TOLERANCE = {torch.bfloat16: (6e-3, 1.6e-2), torch.float32: (1e-5, 1e-6)}

# (experts, top_k, hidden, inter): small E with top_k 2; E=256 top_k 8 (the 35B-A3B routing); H and I that
# are not multiples of the tiles and take several loop steps (H 600 > 512 columns, I 280 > 256).
GEOMETRIES = [(6, 2, 40, 24), (256, 8, 64, 48), (16, 8, 600, 280)]


def _experts(
    num_experts: int, hidden: int, inter: int, dtype: torch.dtype, device: str
) -> tuple[torch.Tensor, torch.Tensor]:
    gate_up = torch.randn(num_experts, 2 * inter, hidden, device=device) * hidden**-0.5
    down = torch.randn(num_experts, hidden, inter, device=device) * inter**-0.5
    return gate_up.to(dtype), down.to(dtype)


def _case(
    tokens: int, num_experts: int, top_k: int, hidden: int, inter: int, dtype: torch.dtype, device: str
) -> tuple[torch.Tensor, ...]:
    x = torch.randn(tokens, hidden, device=device).to(dtype)
    gate_up, down = _experts(num_experts, hidden, inter, dtype, device)
    weights, ids = moe_route_ref(torch.randn(tokens, num_experts, device=device), top_k)
    return x, gate_up, down, weights, ids


@pytest.mark.parametrize("tokens", [1, 3, 8, 37])
@pytest.mark.parametrize(("num_experts", "top_k", "hidden", "inter"), GEOMETRIES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_experts_match_reference(tokens, num_experts, top_k, hidden, inter, dtype, device, assert_close):
    if hidden * inter > 100_000 and tokens > 3 and device == "cpu":
        pytest.skip("the interpreter runs the multi-step geometry at T <= 3 only (it is slow on the CPU)")
    x, gate_up, down, weights, ids = _case(tokens, num_experts, top_k, hidden, inter, dtype, device)
    out = moe_experts(x, gate_up, down, weights, ids)
    assert out.dtype == dtype and out.shape == x.shape
    assert_close("moe_experts", out, moe_experts_ref(x, gate_up, down, weights, ids), *TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_experts_shared_across_tokens(dtype, device, assert_close):
    """Every token picks the same experts (and with E=4, top_k=2 many pairs share an expert anyway)."""
    tokens, hidden, inter = 37, 48, 40
    x = torch.randn(tokens, hidden, device=device).to(dtype)
    gate_up, down = _experts(4, hidden, inter, dtype, device)
    same_ids = torch.tensor([[3, 1]], device=device).expand(tokens, 2)
    weights = torch.rand(tokens, 2, device=device)
    weights = weights / weights.sum(-1, keepdim=True)
    expected = moe_experts_ref(x, gate_up, down, weights, same_ids)
    assert_close(
        "same experts", moe_experts(x, gate_up, down, weights, same_ids), expected, *TOLERANCE[dtype]
    )
    weights, ids = moe_route_ref(torch.randn(tokens, 4, device=device), 2)
    expected = moe_experts_ref(x, gate_up, down, weights, ids)
    assert_close("E=4 top_k=2", moe_experts(x, gate_up, down, weights, ids), expected, *TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_experts_batch_invariant(dtype, device):
    """A token's output is bitwise the same alone, in a sub-batch and in the whole batch (37 x 8 pairs > the
    kernel's SORT_MIN_PAIRS: the whole batch runs its pairs in expert order, the others in token order)."""
    x, gate_up, down, weights, ids = _case(37, 256, 8, 64, 48, dtype, device)
    ids[:, 0] = 7  # and many tokens share an expert
    batch = moe_experts(x, gate_up, down, weights, ids)
    for t in (0, 5, 36):
        alone = moe_experts(x[t : t + 1], gate_up, down, weights[t : t + 1], ids[t : t + 1])
        assert torch.equal(alone[0], batch[t]), f"token {t}: alone differs from the batch of 37"
    sub = moe_experts(x[10:18], gate_up, down, weights[10:18], ids[10:18])
    assert torch.equal(sub, batch[10:18]), "tokens 10..17 as a batch of 8 differ from the batch of 37"


def test_experts_strided_rows_and_empty(device, assert_close):
    base = torch.randn(5, 2 * 40, device=device, dtype=torch.bfloat16)
    x = base[:, 40:]  # row stride 80, unit stride along H
    _, gate_up, down, weights, ids = _case(5, 6, 2, 40, 24, torch.bfloat16, device)
    expected = moe_experts_ref(x, gate_up, down, weights, ids)
    assert_close(
        "strided x", moe_experts(x, gate_up, down, weights, ids), expected, *TOLERANCE[torch.bfloat16]
    )
    empty = moe_experts(x[:0], gate_up, down, weights[:0], ids[:0])
    assert empty.shape == (0, 40)


@pytest.mark.parametrize("tokens", [1, 5, 37])
@pytest.mark.parametrize(("num_experts", "top_k"), [(256, 8), (7, 3), (6, 1), (60, 8)])
@pytest.mark.parametrize("renormalize", [True, False])
def test_route_matches_reference(tokens, num_experts, top_k, renormalize, device, assert_close):
    logits = torch.randn(tokens, num_experts, device=device) * 2
    weights, ids = moe_route(logits, top_k, renormalize)
    ref_weights, ref_ids = moe_route_ref(logits, top_k, renormalize)
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32
    assert torch.equal(ids, ref_ids)
    assert_close("route weights", weights, ref_weights, 1e-5, 1e-6)


def test_route_bf16_logits_strided(device, assert_close):
    """bf16 router logits (the model's dtype), distinct values so the top-k is unambiguous, row-strided."""
    tokens, num_experts = 9, 256
    values = torch.stack([torch.randperm(num_experts, device=device) for _ in range(tokens)]) - 128
    wide = torch.zeros(tokens, 2 * num_experts, device=device, dtype=torch.bfloat16)
    wide[:, :num_experts] = (values / 16).to(torch.bfloat16)  # k/16 with |k| <= 128: exact in bf16
    logits = wide[:, :num_experts]
    weights, ids = moe_route(logits, 8)
    ref_weights, ref_ids = moe_route_ref(logits, 8)
    assert torch.equal(ids, ref_ids)
    assert_close("route weights bf16", weights, ref_weights, 1e-5, 1e-6)


# ---- the routed experts plus the gated shared expert (the whole MoE block's experts) --------------------

# (experts, top_k, hidden, inter, shared inter): I_s = I; I_s > I (more row tiles than the routed experts,
# and not a multiple of the tile); I_s < I with H and I over several loop steps; E=256 top_k=8 routing.
SHARED_GEOMETRIES = [(6, 2, 40, 24, 24), (6, 2, 40, 24, 56), (16, 8, 600, 280, 40), (256, 8, 64, 48, 48)]


def _shared(hidden: int, shared_inter: int, dtype: torch.dtype, device: str) -> SharedExpert:
    """Random shared expert; its gate's logit sigmoid(gate . x) spreads over (0, 1) for x ~ N(0, 1)."""
    gate_proj, up_proj = (torch.randn(shared_inter, hidden, device=device) * hidden**-0.5 for _ in range(2))
    down_proj = torch.randn(hidden, shared_inter, device=device) * shared_inter**-0.5
    gate = torch.randn(1, hidden, device=device) * 2 * hidden**-0.5
    return SharedExpert(*(t.to(dtype) for t in (gate_proj, up_proj, down_proj, gate)))


@pytest.mark.parametrize("tokens", [1, 3, 37])
@pytest.mark.parametrize(("num_experts", "top_k", "hidden", "inter", "shared_inter"), SHARED_GEOMETRIES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_experts_with_shared_match_reference(
    tokens, num_experts, top_k, hidden, inter, shared_inter, dtype, device, assert_close
):
    if tokens > 3 and device == "cpu" and (hidden * inter > 100_000 or dtype == torch.float32):
        pytest.skip(
            "the interpreter runs T=37 in bf16 on the one-step geometries only (it is slow on the CPU)"
        )
    x, gate_up, down, weights, ids = _case(tokens, num_experts, top_k, hidden, inter, dtype, device)
    shared = _shared(hidden, shared_inter, dtype, device)
    out = moe_experts(x, gate_up, down, weights, ids, shared)
    assert out.dtype == dtype and out.shape == x.shape
    expected = moe_experts_ref(x, gate_up, down, weights, ids, shared)
    assert_close("moe_experts + shared", out, expected, *TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_experts_with_shared_match_the_block_as_the_cpu_model_computes_it(dtype, device, assert_close):
    """The fused block vs routed + sigmoid(shared_expert_gate(x)) * shared_expert(x) in separate torch ops
    (engine/model/mlp.py's CPU path; in bf16 each op rounds, so the bound is looser than the fp32 one)."""
    x, gate_up, down, weights, ids = _case(5, 6, 2, 40, 24, dtype, device)
    shared = _shared(40, 56, dtype, device)
    act = F.silu(F.linear(x, shared.gate_proj)) * F.linear(x, shared.up_proj)
    shared_out = torch.sigmoid(F.linear(x, shared.gate)) * F.linear(act, shared.down_proj)
    block = moe_experts_ref(x, gate_up, down, weights, ids) + shared_out
    out = moe_experts(x, gate_up, down, weights, ids, shared)
    ratio, floor = (2e-2, 4e-2) if dtype == torch.bfloat16 else TOLERANCE[dtype]
    assert_close("fused block vs separate ops", out, block, ratio, floor)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_experts_with_shared_batch_invariant(dtype, device):
    """Bitwise: a token alone, in a sub-batch of 8 and in the batch of 37 (37 x 8 routed pairs > the kernel's
    SORT_MIN_PAIRS: the whole batch runs its pairs, the shared ones included, in expert order); I_s != I."""
    x, gate_up, down, weights, ids = _case(37, 256, 8, 64, 48, dtype, device)
    ids[:, 0] = 7  # many tokens share an expert
    shared = _shared(64, 40, dtype, device)
    batch = moe_experts(x, gate_up, down, weights, ids, shared)
    for t in (0, 5, 36):
        alone = moe_experts(x[t : t + 1], gate_up, down, weights[t : t + 1], ids[t : t + 1], shared)
        assert torch.equal(alone[0], batch[t]), f"token {t}: alone differs from the batch of 37"
    sub = moe_experts(x[10:18], gate_up, down, weights[10:18], ids[10:18], shared)
    assert torch.equal(sub, batch[10:18]), "tokens 10..17 as a batch of 8 differ from the batch of 37"


def test_experts_with_shared_strided_and_empty(device, assert_close):
    """x and the shared gate/up rows as row-strided views (unit stride along H), and T = 0."""
    dtype = torch.bfloat16
    x = torch.randn(5, 2 * 40, device=device, dtype=dtype)[:, 40:]
    _, gate_up, down, weights, ids = _case(5, 6, 2, 40, 24, dtype, device)
    shared = _shared(40, 32, dtype, device)
    wide = torch.cat([shared.gate_proj, shared.up_proj], dim=1)  # [I_s, 2H]: row stride 2H
    shared = shared._replace(gate_proj=wide[:, :40], up_proj=wide[:, 40:])
    expected = moe_experts_ref(x, gate_up, down, weights, ids, shared)
    assert_close("strided", moe_experts(x, gate_up, down, weights, ids, shared), expected, *TOLERANCE[dtype])
    assert moe_experts(x[:0], gate_up, down, weights[:0], ids[:0], shared).shape == (0, 40)


# ---- the real 35B-A3B geometry, on the GPU only ---------------------------------------------------------

A3B = dict(num_experts=256, top_k=8, hidden=2048, inter=512)


@pytest.fixture
def cuda_only(device):
    if device != "cuda":
        pytest.skip("the 35B-A3B geometry runs on the GPU only (too slow for the interpreter)")
    return device


@pytest.mark.parametrize("with_shared", [False, True])
@pytest.mark.parametrize("tokens", [1, 8, 64])
def test_a3b_geometry_matches_reference_and_is_batch_invariant(tokens, with_shared, cuda_only, assert_close):
    x, gate_up, down, _, _ = _case(tokens, **A3B, dtype=torch.bfloat16, device=cuda_only)
    shared = _shared(2048, 512, torch.bfloat16, cuda_only) if with_shared else None
    weights, ids = moe_route(torch.randn(tokens, 256, device=cuda_only).bfloat16(), 8)
    out = moe_experts(x, gate_up, down, weights, ids, shared)
    expected = moe_experts_ref(x, gate_up, down, weights, ids, shared)
    assert_close("a3b", out, expected, *TOLERANCE[torch.bfloat16])
    last = tokens - 1
    alone = moe_experts(x[last:], gate_up, down, weights[last:], ids[last:], shared)
    assert torch.equal(alone[0], out[last]), "the last token alone differs from the batch"


def test_cuda_graph_replay_matches_eager(cuda_only):
    """Route + experts (routed + shared, the model's decode path) captured once, replayed over new inputs
    copied into the same tensors (bitwise)."""
    tokens = 8
    x, gate_up, down, _, _ = _case(tokens, **A3B, dtype=torch.bfloat16, device=cuda_only)
    shared = _shared(2048, 512, torch.bfloat16, cuda_only)
    logits = torch.randn(tokens, 256, device=cuda_only).bfloat16()

    def step() -> torch.Tensor:
        weights, ids = moe_route(logits, 8)
        return moe_experts(x, gate_up, down, weights, ids, shared)

    step()  # compile outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        logits.copy_(torch.randn_like(logits))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, step())


# ---- moe_combine: each token's weighted sum of its expert-output rows (+ the shared expert), prefill -----


def _combine_case(
    tokens: int, top_k: int, hidden: int, dtype: torch.dtype, device: str, with_shared: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A buffer of T * top_k + 24 rows (as the grouped GEMM leaves it: the pairs' rows in a shuffled order,
    the rows no pair names set to NaN, so reading one would show)."""
    num_rows = tokens * top_k + 24
    expert_out = torch.randn(num_rows, hidden, device=device).to(dtype)
    rows = torch.randperm(num_rows, device=device)[: tokens * top_k].view(tokens, top_k)
    unused = torch.ones(num_rows, dtype=torch.bool, device=device)
    unused[rows.reshape(-1)] = False
    expert_out[unused] = float("nan")
    weights = torch.rand(tokens, top_k, device=device)
    weights = weights / weights.sum(-1, keepdim=True)
    shared = torch.randn(tokens, hidden, device=device).to(dtype) if with_shared else None
    return expert_out, rows, weights, shared


# (tokens, top_k, hidden): the 35B-A3B top_k and H (two column tiles); a small H not a multiple of anything;
# top_k 3 (BLOCK_TOPK 4, one masked slot) with H over several tiles and a masked tail
COMBINE_CASES = [(1, 8, 2048), (37, 8, 2048), (37, 8, 40), (13, 3, 2500)]


@pytest.mark.parametrize(("tokens", "top_k", "hidden"), COMBINE_CASES)
@pytest.mark.parametrize("with_shared", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_combine_matches_reference(tokens, top_k, hidden, with_shared, dtype, device, assert_close):
    expert_out, rows, weights, shared = _combine_case(tokens, top_k, hidden, dtype, device, with_shared)
    out = moe_combine(expert_out, rows, weights, shared)
    assert out.dtype == dtype and out.shape == (tokens, hidden)
    assert bool(out.isfinite().all()), "a row no pair names was read"
    assert_close("moe_combine", out, moe_combine_ref(expert_out, rows, weights, shared), *TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_combine_batch_invariant_and_strided(dtype, device):
    """Bitwise: a token alone and in the batch; int32 rows, row-strided expert_out and shared (unit stride
    along H) give the same result as contiguous int64 ones; T = 0."""
    expert_out, rows, weights, shared = _combine_case(21, 8, 96, dtype, device, with_shared=True)
    batch = moe_combine(expert_out, rows, weights, shared)
    for t in (0, 20):
        alone = moe_combine(expert_out, rows[t : t + 1], weights[t : t + 1], shared[t : t + 1])
        assert torch.equal(alone[0], batch[t]), f"token {t}: alone differs from the batch"
    wide_out = torch.cat([expert_out, expert_out], dim=1)[:, 96:]
    wide_shared = torch.cat([shared, shared], dim=1)[:, :96]
    strided = moe_combine(wide_out, rows.int(), weights, wide_shared)
    assert torch.equal(strided, batch)
    assert moe_combine(expert_out, rows[:0], weights[:0], shared[:0]).shape == (0, 96)


def test_combine_a3b_prefill_shape(cuda_only, assert_close):
    """The 35B-A3B prefill combine: 7680 tokens x top-8 rows of H 2048 from a 65280-row grouped buffer."""
    expert_out, rows, weights, shared = _combine_case(7680, 8, 2048, torch.bfloat16, cuda_only, True)
    out = moe_combine(expert_out, rows, weights, shared)
    assert bool(out.isfinite().all())
    assert_close(
        "a3b combine", out, moe_combine_ref(expert_out, rows, weights, shared), *TOLERANCE[torch.bfloat16]
    )
