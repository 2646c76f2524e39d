"""A MoE block's router in one launch for decode-sized batches: the router GEMV and the softmax top-k routing.

``moe_router_ref`` is the specification: ``moe_route_ref(linear_ref(x, weight), top_k, renormalize)``, i.e. the
router logits ``x @ weight^T`` summed in fp32 and rounded once to x's dtype (as HF's ``F.linear`` returns them),
then softmax in fp32, the top_k experts, renormalised.

Why one kernel: at decode the router is a [E, H] = [256, 2048] GEMV (1 MiB) whose split-K partial sums need a
reduce launch, followed by the routing launch: three tiny, latency-bound kernels and two launch gaps a layer
(``_linear_gemv_kernel`` + ``_linear_reduce_kernel`` + ``_moe_route_kernel``; with cuBLAS a GEMM and the route).
``_moe_router_kernel`` does all of it in one launch, by "the last program reduces":

* grid ``(cdiv(E, BLOCK_N), SPLIT_K)``, the tiles of ``kernels.linear.gemv_tiles(E, H)`` (the same split of K
  and the same per-step ``tl.dot`` as the GEMV: the logits are bitwise those of ``NINFER_GEMV=on``'s router):
  every program stores its fp32 partial sums ``part[split, t, n]`` for its weight rows, its split of K and the
  T rows of x;
* then it takes a ticket from a per-device int32 counter (``tl.atomic_add``, acq_rel at GPU scope, after a
  CTA barrier so every thread's partial stores come before the release). The program holding the last ticket
  resets the counter to 0 (for the next launch, CUDA-graph replays included) and routes every row: it sums
  each logit's partials in split order (loads cached in L2 only, never a stale L1 line), rounds them to x's
  dtype, and routes them with ``kernels.moe.route_rows`` on one ``[ROUTE_BLOCK_T, BLOCK_E]`` tile (all T rows
  at once, one row's reductions never mixing with another's): the helper ``_moe_route_kernel`` runs too, so the
  split path's weights and ids are the same bits (route_rows' docstring says why its bits do not depend on the
  tile's layout; on the H200 in session 9 the kernel's own softmax copy did not match the route kernel's).

Batch invariance: the tiles come from (E, H, dtype) only, T is a run-time argument (one compiled kernel for
T = 1..8), each output column of the dot reads its own row of x, the split order is fixed and the routing
reduces along the expert axis of each row alone: a row's weights and ids are bitwise the same alone or in any
batch. Which program happens to be last changes nothing. No host sync and fixed shapes (the partials buffer
is [SPLIT_K, T, E]): the launch can be captured in a CUDA graph. NOTE: launches sharing one counter must not
run concurrently (the engine runs a model's layers in order on one stream); ``counter`` lets a caller bring
its own.
"""

from __future__ import annotations

import torch

from kernels import _dispatch
from kernels._dispatch import HAS_TRITON, use_triton
from kernels.linear import GEMV_MAX_ROWS, gemv_tiles, linear, linear_ref
from kernels.moe import ROUTE_BLOCK_T, moe_route, moe_route_ref

if HAS_TRITON:
    import triton
    import triton.language as tl

    from kernels.linear import gemv_split_tile
    from kernels.moe import route_rows


def moe_router_ref(
    x: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [T, H]; weight: [E, H] (x's dtype) -> (weights [T, top_k] fp32, expert_ids [T, top_k] int64), best
    first: ``moe_route_ref`` of the logits ``linear_ref(x, weight)`` (fp32 sums rounded once to x's dtype)."""
    return moe_route_ref(linear_ref(x, weight), top_k, renormalize)


if HAS_TRITON:

    @triton.jit
    def _moe_router_kernel(
        x_ptr,
        w_ptr,
        part_ptr,
        count_ptr,
        weights_ptr,
        ids_ptr,
        T,
        x_stride,
        NUM_EXPERTS: tl.constexpr,
        K_SPLIT: tl.constexpr,
        SPLIT_K: tl.constexpr,
        TOP_K: tl.constexpr,
        BLOCK_TOPK: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_E: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        NUM_STAGES: tl.constexpr,
        RENORMALIZE: tl.constexpr,
        IEEE: tl.constexpr,
    ):
        # grid (cdiv(E, BLOCK_N), SPLIT_K). Phase 1 (every program): _linear_gemv_kernel's loop for weight rows
        # tile * BLOCK_N.. and columns split * K_SPLIT.., fp32 partials stored at part[split, t, n]. Phase 2
        # (the last program to take a ticket): the logits of all T rows, then the routing (see the docstring).
        DOT_T: tl.constexpr = 16  # x's rows as the dot's columns (rows past T load as zeros, never stored)
        tile = tl.program_id(0)
        split = tl.program_id(1)
        rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        ts = tl.arange(0, DOT_T)
        t_mask = (ts < T)[None, :]
        acc = gemv_split_tile(
            x_ptr, w_ptr, rows, ts, t_mask, split, NUM_EXPERTS, x_stride, K_SPLIT * SPLIT_K, K_SPLIT, BLOCK_N,
            BLOCK_K, DOT_T, NUM_STAGES, IEEE,
        )  # fmt: skip
        part_ptrs = part_ptr + split * (T * NUM_EXPERTS) + ts[None, :] * NUM_EXPERTS + rows[:, None]
        tl.store(part_ptrs, acc, mask=(rows < NUM_EXPERTS)[:, None] & t_mask)
        # every thread's partials are stored before the ticket's release (CTA barrier, then acq_rel at GPU scope)
        tl.debug_barrier()
        ticket = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu")
        if ticket == tl.num_programs(0) * tl.num_programs(1) - 1:
            tl.store(count_ptr, 0)  # the next launch starts from 0 (kernel boundaries order it)
            tl.debug_barrier()
            rs = tl.arange(0, BLOCK_T)
            es = tl.arange(0, BLOCK_E)
            e_ok = es < NUM_EXPERTS
            mask = (rs < T)[:, None] & e_ok[None, :]
            offs = rs[:, None] * NUM_EXPERTS + es[None, :]  # [BLOCK_T, BLOCK_E]
            total = tl.zeros([BLOCK_T, BLOCK_E], dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):  # split order: the reduce kernel's sum
                total += tl.load(
                    part_ptr + s * (T * NUM_EXPERTS) + offs, mask=mask, other=0.0, cache_modifier=".cg"
                )
            logits = total.to(x_ptr.dtype.element_ty).to(tl.float32)  # rounded as F.linear's logits
            logits = tl.where(e_ok[None, :], logits, float("-inf"))  # padding experts: never picked
            top_p, top_i = route_rows(logits, es, BLOCK_T, TOP_K, BLOCK_TOPK, RENORMALIZE)
            ks = tl.arange(0, BLOCK_TOPK)
            out = rs[:, None] * TOP_K + ks[None, :]
            out_mask = (rs < T)[:, None] & (ks < TOP_K)[None, :]
            tl.store(weights_ptr + out, top_p, mask=out_mask)
            tl.store(ids_ptr + out, top_i.to(tl.int64), mask=out_mask)


_COUNTERS: dict[torch.device, torch.Tensor] = {}


def router_counter(device: torch.device) -> torch.Tensor:
    """The device's ticket counter ([1] int32, zero between launches), made once and kept (a CUDA graph holds
    its address). NOTE: make it before a graph capture (the engine's warm-up runs every layer eagerly first)."""
    counter = _COUNTERS.get(device)
    if counter is None:
        counter = _COUNTERS[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return counter


def moe_router(
    x: torch.Tensor,
    weight: torch.Tensor,
    top_k: int,
    renormalize: bool = True,
    counter: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launcher for ``moe_router_ref``'s contract: under ``NINFER_MOE_ROUTER=fused``, ``_moe_router_kernel`` (one
    launch) for 1..``GEMV_MAX_ROWS`` rows where the kernels run Triton; otherwise (``split``, the default; the
    CPU, ``NINFER_KERNELS=ref``, more rows) the router linear (``kernels.linear.linear``) and
    ``kernels.moe.moe_route``, the path the kernel replaces.

    x: [T, H], unit stride along H; weight: [E, H] contiguous, x's dtype; counter: a [1] int32 zero tensor on
    x's device (default ``router_counter``) -> (weights [T, top_k] fp32, expert_ids [T, top_k] int64).
    """
    num_tokens = x.shape[0]
    assert GEMV_MAX_ROWS <= ROUTE_BLOCK_T, "the fused router routes its rows as one route_rows tile"
    fused = _dispatch.MOE_ROUTER_MODE == "fused" and 1 <= num_tokens <= GEMV_MAX_ROWS
    if not fused or not use_triton(x, weight):
        return moe_route(linear(x, weight), top_k, renormalize)
    num_experts, hidden = weight.shape
    assert x.shape[1] == hidden and x.dtype == weight.dtype, f"x {x.shape} {x.dtype}, weight {weight.shape}"
    assert x.stride(1) == 1 and weight.is_contiguous(), "x needs unit stride along H, weight contiguity"
    assert 1 <= top_k <= num_experts, f"top_k {top_k} for {num_experts} experts"
    tiles = gemv_tiles(num_experts, hidden, weight.dtype)
    counter = router_counter(x.device) if counter is None else counter
    device = x.device
    part = torch.empty(tiles.split_k, num_tokens, num_experts, dtype=torch.float32, device=device)
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=device)
    expert_ids = torch.empty(num_tokens, top_k, dtype=torch.int64, device=device)
    _moe_router_kernel[(triton.cdiv(num_experts, tiles.block_n), tiles.split_k)](
        x, weight, part, counter, weights, expert_ids, num_tokens, x.stride(0),
        NUM_EXPERTS=num_experts, K_SPLIT=hidden // tiles.split_k, SPLIT_K=tiles.split_k, TOP_K=top_k,
        BLOCK_TOPK=triton.next_power_of_2(top_k), BLOCK_T=ROUTE_BLOCK_T,
        BLOCK_E=triton.next_power_of_2(num_experts), BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
        NUM_STAGES=tiles.num_stages, RENORMALIZE=renormalize, IEEE=x.dtype == torch.float32,
        num_warps=tiles.num_warps,
    )  # fmt: skip
    return weights, expert_ids
