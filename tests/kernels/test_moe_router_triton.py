"""Triton ``moe_router`` (router GEMV + softmax top-k in one launch, the last program routing) vs its reference:
exact ids on fp32 logits, a valid top-k of the reference logits in bf16, bitwise the split path it replaces
(``linear`` GEMV + reduce + ``moe_route``), bitwise batch invariance, the ticket counter back at zero after
every launch (a CUDA graph replayed over new inputs on the GPU), the real 35B-A3B router shape (GPU; or CPU
under TRITON_INTERPRET=1)."""

from __future__ import annotations

import pytest
import torch

import kernels._dispatch
from kernels.linear import linear, linear_ref
from kernels.moe import moe_route
from kernels.moe_router import moe_router, moe_router_ref, router_counter

# NOTE: interpreter_fixes (conftest.py): Triton 3.6's interpreter multiplies bf16 dot operands as raw integers
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("interpreter_fixes")]


@pytest.fixture(autouse=True)
def _fused(monkeypatch: pytest.MonkeyPatch) -> None:
    """``moe_router`` runs its kernel here (NINFER_MOE_ROUTER=fused; the default ``split`` is the old path)."""
    monkeypatch.setattr(kernels._dispatch, "MOE_ROUTER_MODE", "fused")


# (experts, hidden, top_k): odd E and H (one unsplit K step, masked); K over several unsplit steps; the
# 35B-A3B router [256, 2048], top_k 8 (K split in 8 for bf16, 16 for fp32)
GEOMETRIES = [(6, 40, 2), (60, 600, 8), (7, 300, 3), (256, 2048, 8)]


def _inputs(
    rows: int, experts: int, hidden: int, dtype: torch.dtype, device: str
) -> tuple[torch.Tensor, ...]:
    x = torch.randn(rows, hidden, device=device).to(dtype)
    weight = (torch.randn(experts, hidden, device=device) * hidden**-0.5 * 2).to(dtype)
    return x, weight


@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize(("experts", "hidden", "top_k"), GEOMETRIES)
@pytest.mark.parametrize("renormalize", [True, False])
def test_fp32_matches_reference(rows, experts, hidden, top_k, renormalize, device, assert_close):
    x, weight = _inputs(rows, experts, hidden, torch.float32, device)
    weights, ids = moe_router(x, weight, top_k, renormalize)
    ref_weights, ref_ids = moe_router_ref(x, weight, top_k, renormalize)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int64
    assert weights.shape == ids.shape == (rows, top_k)
    assert torch.equal(ids, ref_ids)
    assert_close("router weights fp32", weights, ref_weights, 1e-5, 1e-6)


@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize(("experts", "hidden", "top_k"), GEOMETRIES)
def test_bf16_is_a_top_k_of_the_reference_logits(rows, experts, hidden, top_k, device):
    """bf16 logits tie and round (the interpreter truncates): the chosen experts hold the top_k logits of the
    reference up to one bf16 ulp, best first, and their weights are the reference's renormalised probabilities
    of those experts."""
    x, weight = _inputs(rows, experts, hidden, torch.bfloat16, device)
    weights, ids = moe_router(x, weight, top_k)
    logits = linear_ref(x, weight).float()
    ulp = 2.0**-7 * logits.abs().amax(dim=-1, keepdim=True)
    chosen = logits.gather(1, ids)
    others = logits.scatter(1, ids, float("-inf"))
    assert all(len(set(row.tolist())) == top_k for row in ids), "an expert chosen twice"
    assert bool((chosen.amin(dim=-1, keepdim=True) >= others.amax(dim=-1, keepdim=True) - ulp).all())
    assert bool((chosen[:, 1:] <= chosen[:, :-1] + ulp).all()), "not best first"
    probs = logits.softmax(dim=-1).gather(1, ids)
    torch.testing.assert_close(weights, probs / probs.sum(dim=-1, keepdim=True), rtol=0.05, atol=1e-3)


@pytest.mark.parametrize("rows", [1, 2, 5, 8])
@pytest.mark.parametrize(("experts", "hidden", "top_k"), [(60, 600, 8), (256, 2048, 8)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_bitwise_the_split_path(rows, experts, hidden, top_k, dtype, device, monkeypatch):
    """The same logits as the GEMV (its tiles, split order and rounding) and the same routing as
    ``moe_route``: the fused launch changes no bit of what NINFER_GEMV=on's three launches give."""
    monkeypatch.setattr(kernels._dispatch, "GEMV_MODE", "on")
    x, weight = _inputs(rows, experts, hidden, dtype, device)
    weights, ids = moe_router(x, weight, top_k)
    split_weights, split_ids = moe_route(linear(x, weight), top_k)
    assert torch.equal(ids, split_ids)
    assert torch.equal(weights, split_weights)


@pytest.mark.parametrize(("experts", "hidden", "top_k"), [(7, 300, 3), (256, 2048, 8)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_batch_invariant(experts, hidden, top_k, dtype, device):
    x, weight = _inputs(8, experts, hidden, dtype, device)
    weights, ids = moe_router(x, weight, top_k)
    for row in range(8):
        for batch in (x[row : row + 1], x[: row + 1]):
            alone_weights, alone_ids = moe_router(batch, weight, top_k)
            assert torch.equal(alone_ids[-1], ids[row]), f"row {row} of {batch.shape[0]}: ids differ"
            assert torch.equal(alone_weights[-1], weights[row]), (
                f"row {row} of {batch.shape[0]}: weights differ"
            )


def test_strided_rows_and_own_counter(device):
    """x as a row-strided view; a caller's own counter; both counters back at zero after every launch."""
    wide = torch.randn(4, 2 * 600, device=device).bfloat16()
    x = wide[:, :600]
    weight = (torch.randn(60, 600, device=device) * 0.05).bfloat16()
    counter = torch.zeros(1, dtype=torch.int32, device=device)
    got = moe_router(x, weight, 8, counter=counter)
    expected = moe_router(x.contiguous(), weight, 8)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert counter.item() == 0 and router_counter(x.device).item() == 0


def test_launch_after_launch_is_the_split_path(device, monkeypatch):
    """Many launches in a row, new inputs each (on the GPU 200 at the 35B-A3B router, its 64 programs racing
    for the tickets): each the split path's routing, bitwise; the counter back at zero."""
    monkeypatch.setattr(kernels._dispatch, "GEMV_MODE", "on")
    launches = 200 if device == "cuda" else 3
    _, weight = _inputs(1, 256, 2048, torch.bfloat16, device)
    for i in range(launches):
        x = torch.randn(1 + i % 8, 2048, device=device).bfloat16()
        weights, ids = moe_router(x, weight, 8)
        split_weights, split_ids = moe_route(linear(x, weight), 8)
        assert torch.equal(ids, split_ids) and torch.equal(weights, split_weights), f"launch {i}"
    assert router_counter(weight.device).item() == 0


def test_launches_in_a_row_and_graph_replay(device):
    """Launch after launch (and, on CUDA, a captured graph replayed over new inputs copied into the same
    tensors) the counter restarts at zero and every launch routes its own inputs."""
    x, weight = _inputs(8, 256, 2048, torch.bfloat16, device)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        weights, ids = moe_router(x, weight, 8)
        ref_weights, ref_ids = moe_router(x.clone(), weight, 8)  # same launcher, fresh buffers
        assert torch.equal(ids, ref_ids) and torch.equal(weights, ref_weights)
        assert router_counter(x.device).item() == 0
    if device != "cuda":
        return
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        moe_router(x, weight, 8)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = moe_router(x, weight, 8)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        eager = moe_router(x, weight, 8)
        assert torch.equal(captured[0], eager[0]) and torch.equal(captured[1], eager[1])
        assert router_counter(x.device).item() == 0


def test_more_rows_and_split_mode_take_the_split_path(device, monkeypatch):
    x, weight = _inputs(9, 16, 64, torch.float32, device)
    counter = torch.full((1,), 7, dtype=torch.int32, device=device)  # a launch would add to it
    weights, ids = moe_router(x, weight, 4, counter=counter)
    ref_weights, ref_ids = moe_route(linear(x, weight), 4)
    assert torch.equal(ids, ref_ids) and torch.equal(weights, ref_weights)
    monkeypatch.setattr(kernels._dispatch, "MOE_ROUTER_MODE", "split")
    weights, ids = moe_router(x[:2], weight, 4, counter=counter)
    ref_weights, ref_ids = moe_route(linear(x[:2], weight), 4)
    assert torch.equal(ids, ref_ids) and torch.equal(weights, ref_weights)
    assert counter.item() == 7, "the kernel ran"
