# ruff: noqa: B023  (every timed closure runs inside its own loop iteration)
"""bench/kernels/hot_path.py's MoE rows at the Qwen3.6-35B-A3B geometry: routing, the routed experts and
their tile sweeps, the whole block, the prefill experts.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import torch
import torch.nn.functional as F
from hot_path_common import (
    BF16,
    DEV,
    ROWS,
    _err,
    _read_us,
    _row,
    _us,
)

from engine.model.mlp import SparseMoeBlock, _experts_gathered, _experts_grouped, expert_groups  # noqa: E402
from engine.testing.synthetic import GEOMETRIES  # noqa: E402
from kernels.moe import (  # noqa: E402
    SharedExpert,
    _launch_down,
    _launch_gate_up,
    moe_combine,
    moe_combine_ref,
    moe_experts,
    moe_experts_ref,
    moe_route,
    moe_route_ref,
    moe_tiles,
)

# ---- MoE: the routed experts at the Qwen3.6-35B-A3B geometry ----------------------------------------------

MOE_E, MOE_TOPK, MOE_H, MOE_I = 256, 8, 2048, 512  # Qwen3.6-35B-A3B: experts, top-k, hidden, inter
MOE_LAYERS = 32  # routings timed back to back in one graph, as a decode step runs its layers (> L2 together)
# tile sweeps (MoeTiles fields of the kernel in question; the other kernel keeps moe_tiles' choice)
GATE_UP_TILES = ((16, 512, 8), (8, 1024, 8), (8, 512, 4), (16, 256, 4), (4, 2048, 8), (32, 256, 8))
DOWN_TILES = ((4, 512, 8), (2, 512, 4), (8, 512, 8), (4, 256, 4), (8, 256, 8), (1, 512, 4))


def _moe_layers_row(op: str, shape: str, nbytes: float, fn: Callable[[], object], read_gbps: float,
                    extra: dict | None = None) -> float:  # fmt: skip
    """One row for MOE_LAYERS calls replayed as one graph: time and bytes per layer, fraction of read BW."""
    t = _us(fn, graph=True) / MOE_LAYERS
    gbps = nbytes / t / 1e3
    ROWS.append({"op": op, "shape": shape, "kernel_us": round(t, 2), "ref_us": None, "bytes": int(nbytes),
                 "kernel_GBps": round(gbps, 1), "fraction_of_read": round(gbps / read_gbps, 3), **(extra or {})})  # fmt: skip
    print(json.dumps(ROWS[-1]), flush=True)
    return t


def bench_moe() -> None:
    """Routing and routed experts of one MoE layer at 35B-A3B decode shapes (T = 1, 8; 64 for MTP verify and
    small batches). Bytes = the distinct chosen experts' weights (6 MiB each; the kernels read an expert's
    rows once per pair, the repeats of an expert shared by several tokens come from L2). Rows:
    - ``moe_route``: softmax + top-8 + renormalise vs the torch reference;
    - ``moe_experts`` on one routing repeated (L2-warm: 48 MiB at T=1 is about the L2 size) vs the reference,
      with the previous gather + bmm path's time beside it;
    - ``moe_experts x32 layers``: 32 different routings back to back (T=1: disjoint experts, so every read
      is from HBM), the number to compare with the read bandwidth; the gather + bmm path the same way;
    - per-kernel rows (gate_up 4 MiB, down 2 MiB per expert) and the tile sweeps, at T=1 and T=8.
    """
    read_us = _read_us()
    read_gbps = (1 << 31) / read_us / 1e3
    ROWS.append({"op": "read bandwidth (fp32 sum)", "shape": "2 GiB", "kernel_us": round(read_us, 2),
                 "ref_us": None, "bytes": 1 << 31, "kernel_GBps": round(read_gbps, 1)})  # fmt: skip
    print(json.dumps(ROWS[-1]), flush=True)
    gate_up = torch.randn(MOE_E, 2 * MOE_I, MOE_H, device=DEV, dtype=BF16) * MOE_H**-0.5
    down = torch.randn(MOE_E, MOE_H, MOE_I, device=DEV, dtype=BF16) * MOE_I**-0.5
    gate_up_bytes, down_bytes = 2 * MOE_I * MOE_H * 2, MOE_H * MOE_I * 2
    default = moe_tiles(MOE_H, MOE_I, MOE_TOPK, BF16)
    shareds = [_moe_shared() for _ in range(MOE_LAYERS)]  # one per layer (192 MiB: not L2-resident)
    for tokens in (1, 8, 64):
        shape = f"T{tokens} E{MOE_E} k{MOE_TOPK} H{MOE_H} I{MOE_I}"
        x = torch.randn(tokens, MOE_H, device=DEV, dtype=BF16)
        logits = torch.randn(MOE_LAYERS, tokens, MOE_E, device=DEV, dtype=BF16)
        same_ids = torch.equal(moe_route(logits[0], MOE_TOPK)[1], moe_route_ref(logits[0], MOE_TOPK)[1])
        err = {"ids_equal": bool(same_ids)}
        _row("moe_route", f"T{tokens} E{MOE_E} k{MOE_TOPK}", logits[0].numel() * 2,
             lambda: moe_route(logits[0], MOE_TOPK), lambda: moe_route_ref(logits[0], MOE_TOPK), err)  # fmt: skip
        routes = [moe_route(layer, MOE_TOPK) for layer in logits]
        if tokens == 1:  # disjoint experts from layer to layer: nothing of one layer's experts is in L2
            perm = torch.randperm(MOE_E, device=DEV).view(MOE_LAYERS, 1, MOE_TOPK)
            routes = [(w, perm[j]) for j, (w, _) in enumerate(routes)]
        distinct = [int(ids.unique().numel()) for _, ids in routes]
        weights, ids = routes[0]
        full = moe_experts(x, gate_up, down, weights, ids)
        extra = _err(full, moe_experts_ref(x, gate_up, down, weights, ids))
        extra["distinct_experts"] = distinct[0]
        alone = moe_experts(x[-1:], gate_up, down, weights[-1:], ids[-1:])
        extra["batch_invariant"] = bool(torch.equal(alone[0], full[-1]))
        if tokens <= 8:
            gathered = _us(lambda: _experts_gathered(x, gate_up, down, weights, ids), graph=True)
            extra["gathered_bmm_us"] = round(gathered, 2)
        _row("moe_experts (one routing repeated, L2-warm)", shape, distinct[0] * (gate_up_bytes + down_bytes),
             lambda: moe_experts(x, gate_up, down, weights, ids),
             lambda: moe_experts_ref(x, gate_up, down, weights, ids), extra)  # fmt: skip
        mean_distinct = sum(distinct) / len(distinct)
        layers_bytes = mean_distinct * (gate_up_bytes + down_bytes)
        info = {"mean_distinct_experts": round(mean_distinct, 2), "read_GBps": round(read_gbps, 1)}

        def experts_layers() -> None:
            for w, e in routes:
                moe_experts(x, gate_up, down, w, e)

        _moe_layers_row("moe_experts x32 layers", shape, layers_bytes, experts_layers, read_gbps, info)
        route_and_experts = [(layer, MOE_TOPK) for layer in logits]

        def route_experts_layers() -> None:
            for layer, k in route_and_experts:
                w, e = moe_route(layer, k)
                moe_experts(x, gate_up, down, w, e)

        if tokens > 1:  # (at T=1 the routed ids are the random ones, not the disjoint ones above)
            _moe_layers_row("moe_route + moe_experts x32 layers", shape, layers_bytes, route_experts_layers,
                            read_gbps, info)  # fmt: skip
        if tokens <= 8:

            def gathered_layers() -> None:
                for w, e in routes:
                    _experts_gathered(x, gate_up, down, w, e)

            _moe_layers_row("gather + bmm (previous path) x32 layers", shape, layers_bytes, gathered_layers,
                            read_gbps, info)  # fmt: skip
        if tokens > 8:
            continue
        # the model's decode path: routed + each layer's own shared expert (I_s = I) in the same two kernels
        act = torch.empty(tokens, (MOE_TOPK + 1) * MOE_I, device=DEV)
        out = torch.empty(tokens, MOE_H, device=DEV, dtype=BF16)
        _launch_gate_up(x, gate_up, weights, ids, shareds[0], act, default)
        act_ref = act.clone()
        _launch_down(act_ref, down, ids, shareds[0], out, default)
        out_ref = out.clone()
        layer_routes = list(zip(routes, shareds, strict=True))
        for block_n, block_k, warps in GATE_UP_TILES:
            tiles = default._replace(block_n=block_n, block_k=block_k, warps_gate_up=warps)
            _launch_gate_up(x, gate_up, weights, ids, shareds[0], act, tiles)
            check = {"tiles": list(tiles), **_err(act, act_ref)}

            def gate_up_layers() -> None:
                for (w, e), sh in layer_routes:
                    _launch_gate_up(x, gate_up, w, e, sh, act, tiles)

            _moe_layers_row(f"moe gate_up kernel + shared x32 BLOCK_N={block_n} BLOCK_K={block_k} warps={warps}",
                            shape, (mean_distinct + 1) * gate_up_bytes, gate_up_layers, read_gbps, check)  # fmt: skip
        for block_h, block_i, warps in DOWN_TILES:
            tiles = default._replace(block_h=block_h, block_i=block_i, warps_down=warps)
            _launch_down(act_ref, down, ids, shareds[0], out, tiles)
            check = {"tiles": list(tiles), **_err(out, out_ref)}

            def down_layers() -> None:
                for (_, e), sh in layer_routes:
                    _launch_down(act_ref, down, e, sh, out, tiles)

            _moe_layers_row(f"moe down kernel + shared x32 BLOCK_H={block_h} BLOCK_I={block_i} warps={warps}", shape,
                            (mean_distinct + 1) * down_bytes, down_layers, read_gbps, check)  # fmt: skip
    bench_moe_block(gate_up, down, shareds, read_gbps)
    bench_moe_prefill(gate_up, down, read_gbps)


def _moe_shared() -> SharedExpert:
    """A random shared expert of the 35B-A3B geometry (I_s = I = 512): 6 MiB of bf16."""
    return SharedExpert(
        torch.randn(MOE_I, MOE_H, device=DEV, dtype=BF16) * MOE_H**-0.5,
        torch.randn(MOE_I, MOE_H, device=DEV, dtype=BF16) * MOE_H**-0.5,
        torch.randn(MOE_H, MOE_I, device=DEV, dtype=BF16) * MOE_I**-0.5,
        torch.randn(1, MOE_H, device=DEV, dtype=BF16) * MOE_H**-0.5,
    )


def _moe_block(
    gate_up: torch.Tensor, down: torch.Tensor, shared: SharedExpert, router: torch.Tensor
) -> SparseMoeBlock:
    """The model's MoE block (engine/model/mlp.py) over the given tensors (the routed experts shared by all
    the blocks built here: 1.5 GiB each otherwise), as the loader assigns them."""
    with torch.device("meta"):
        block = SparseMoeBlock(GEOMETRIES["qwen3.6-35b-a3b"])
    state = {"gate.weight": router, "experts.gate_up_proj": gate_up, "experts.down_proj": down,
             "shared_expert.gate_proj.weight": shared.gate_proj, "shared_expert.up_proj.weight": shared.up_proj,
             "shared_expert.down_proj.weight": shared.down_proj, "shared_expert_gate.weight": shared.gate}  # fmt: skip
    block.load_state_dict(state, strict=True, assign=True)
    return block.requires_grad_(False).eval()


def _moe_block_previous(block: SparseMoeBlock, x: torch.Tensor) -> torch.Tensor:
    """The block as engine/model/mlp.py ran it on CUDA for few tokens before the shared expert joined the
    fused kernels: route, the two routed-expert kernels, then the shared expert as an eager MLP and its
    sigmoid gate (about 9 more launches), and the sum."""
    weights, ids = moe_route(F.linear(x, block.gate.weight), block.top_k)
    routed = moe_experts(x, block.experts.gate_up_proj, block.experts.down_proj, weights, ids)
    return routed + torch.sigmoid(block.shared_expert_gate(x)) * block.shared_expert(x)


def bench_moe_block(
    gate_up: torch.Tensor, down: torch.Tensor, shareds: list[SharedExpert], read_gbps: float
) -> None:
    """The whole MoE block (router GEMV, routing, routed experts, gated shared expert) at 35B-A3B decode
    shapes, T = 1 and 8: MOE_LAYERS blocks, each with its own router and shared expert, replayed as one
    graph; the model's fused path (``SparseMoeBlock.forward``: the shared expert in the routed kernels, 4
    launches) against the previous one (routed kernels + the shared expert as separate ops, 13 launches).
    At T=1 each layer's router is built to pick 8 experts no other layer picks (every read from HBM).
    Bytes: router + distinct experts + shared expert per layer. The saving per layer x 40 layers is about
    what a 35B-A3B decode step gains."""
    expert_bytes = 3 * MOE_I * MOE_H * 2  # gate, up and down of one expert (routed or shared)
    for tokens in (1, 8):
        shape = f"T{tokens} E{MOE_E} k{MOE_TOPK} H{MOE_H} I{MOE_I} I_s{MOE_I}"
        x = torch.randn(tokens, MOE_H, device=DEV, dtype=BF16)
        routers = [torch.randn(MOE_E, MOE_H, device=DEV, dtype=BF16) * MOE_H**-0.5 for _ in shareds]
        if tokens == 1:  # logit + 8 on 8 experts of a permutation: disjoint expert sets from layer to layer
            perm = torch.randperm(MOE_E, device=DEV).view(len(shareds), MOE_TOPK)
            for router, chosen in zip(routers, perm, strict=True):
                router[chosen] += (8 * x[0] / x[0].float().pow(2).sum()).to(BF16)
        blocks = [_moe_block(gate_up, down, sh, r) for sh, r in zip(shareds, routers, strict=True)]
        distinct = [int(moe_route(F.linear(x, b.gate.weight), MOE_TOPK)[1].unique().numel()) for b in blocks]
        mean_distinct = sum(distinct) / len(distinct)
        layer_bytes = MOE_E * MOE_H * 2 + (mean_distinct + 1) * expert_bytes
        fused, previous = blocks[0](x), _moe_block_previous(blocks[0], x)
        check = {**_err(fused, previous), "mean_distinct_experts": round(mean_distinct, 2),
                 "batch_invariant": bool(torch.equal(blocks[0](x[-1:])[0], fused[-1])),
                 "read_GBps": round(read_gbps, 1)}  # fmt: skip

        def fused_layers() -> None:
            for block in blocks:
                block(x)

        def previous_layers() -> None:
            for block in blocks:
                _moe_block_previous(block, x)

        t_prev = _moe_layers_row("moe block, previous (shared expert as eager ops) x32 layers", shape, layer_bytes,
                                 previous_layers, read_gbps, check)  # fmt: skip
        t_fused = _moe_layers_row("moe block, fused (shared expert in the expert kernels) x32 layers", shape,
                                  layer_bytes, fused_layers, read_gbps, check)  # fmt: skip
        saved = {"saved_us_per_layer": round(t_prev - t_fused, 2),
                 "saved_ms_per_step_40_layers": round(40 * (t_prev - t_fused) / 1e3, 3)}  # fmt: skip
        ROWS[-1].update(saved)
        print(json.dumps(saved), flush=True)


MOE_PREFILL_TOKENS = 7680  # the ninfer-bench prefill of the 35B-A3B profile


def _experts_grouped_previous(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, weights: torch.Tensor,
                              expert_ids: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """engine/model/mlp.py's CUDA prefill experts before moe_combine (kept here to time against): host-synced
    counts, gather in pair order, zero fill + index_put into the padded groups, fp32 SiLU chain, gather back,
    fp32 weights and index_add_, then + the shared expert in bf16."""
    num_experts, top_k = gate_up.shape[0], expert_ids.shape[1]
    flat = expert_ids.reshape(-1)
    order = flat.argsort(stable=True)
    token_of = order // top_k
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    padded = [-(-c // 16) * 16 for c in counts]
    ends = torch.tensor(padded, device=x.device).cumsum(0)
    src_starts = torch.tensor(counts, device=x.device).cumsum(0) - torch.tensor(counts, device=x.device)
    sorted_experts = flat[order]
    dest = (ends - torch.tensor(padded, device=x.device))[sorted_experts] + torch.arange(
        flat.numel(), device=x.device) - src_starts[sorted_experts]  # fmt: skip
    offs = ends.to(torch.int32)
    grouped = x.new_zeros(sum(padded), x.shape[-1])
    grouped[dest] = x[token_of]
    gate, up = torch._grouped_mm(grouped, gate_up.transpose(1, 2), offs=offs).chunk(2, dim=-1)
    act = (F.silu(gate.float()) * up.float()).to(x.dtype)
    ys = torch._grouped_mm(act, down.transpose(1, 2), offs=offs)[dest].float()
    ys = ys * weights.reshape(-1)[order].float().unsqueeze(-1)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    out.index_add_(0, token_of, ys)
    return out.to(x.dtype) + shared


def bench_moe_prefill(gate_up: torch.Tensor, down: torch.Tensor, read_gbps: float) -> None:
    """The MoE prefill path outside the grouped GEMMs at 35B-A3B, T = 7680 (one layer, a random routing):
    - ``moe_combine`` (+ the shared expert's output) over the grouped buffer ``expert_groups`` lays out
      (65280 rows, each token's 8 rows scattered over it) vs its reference; bytes = the T x 8 bf16 rows read +
      shared read + out written; ``previous_us``: the fp32 gather, weight multiply and index_add_ it replaces;
    - ``_experts_grouped`` (route excluded: grouping, gather, 2 grouped GEMMs, silu_mul, combine) timed eagerly
      as the engine runs prefill, against the previous implementation (``ref_us``), bit-for-bit not expected
      (one rounding instead of two)."""
    tokens = MOE_PREFILL_TOKENS
    x = torch.randn(tokens, MOE_H, device=DEV, dtype=BF16)
    shared = torch.randn(tokens, MOE_H, device=DEV, dtype=BF16) * 0.1
    weights, ids = moe_route(torch.randn(tokens, MOE_E, device=DEV, dtype=BF16), MOE_TOPK)
    groups = expert_groups(ids, MOE_E)
    expert_out = torch.randn(groups.token_idx.numel(), MOE_H, device=DEV, dtype=BF16)
    rows = groups.row_idx
    pair_token = torch.arange(tokens, device=DEV).repeat_interleave(MOE_TOPK)

    def previous_combine() -> torch.Tensor:
        ys = expert_out[rows.reshape(-1)].float() * weights.reshape(-1, 1)
        out = torch.zeros(tokens, MOE_H, dtype=torch.float32, device=DEV)
        return out.index_add_(0, pair_token, ys).to(BF16) + shared

    shape = f"T{tokens} k{MOE_TOPK} H{MOE_H} rows{expert_out.shape[0]}"
    nbytes = (tokens * MOE_TOPK + 2 * tokens) * MOE_H * 2
    extra = {**_err(moe_combine(expert_out, rows, weights, shared), moe_combine_ref(expert_out, rows, weights, shared)),
             "previous_us": round(_us(previous_combine, graph=False), 2), "read_GBps": round(read_gbps, 1)}  # fmt: skip
    _row("moe_combine + shared", shape, nbytes, lambda: moe_combine(expert_out, rows, weights, shared),
         lambda: moe_combine_ref(expert_out, rows, weights, shared), extra)  # fmt: skip
    new = _experts_grouped(x, gate_up, down, weights, ids, shared)
    extra = _err(new, _experts_grouped_previous(x, gate_up, down, weights, ids, shared))
    extra["graph_us"] = round(
        _us(lambda: _experts_grouped(x, gate_up, down, weights, ids, shared), graph=True), 2
    )
    t_new = _us(lambda: _experts_grouped(x, gate_up, down, weights, ids, shared), graph=False)
    t_old = _us(lambda: _experts_grouped_previous(x, gate_up, down, weights, ids, shared), graph=False)
    ROWS.append({"op": "moe prefill experts (_experts_grouped + shared, eager) vs previous", "shape": shape,
                 "kernel_us": round(t_new, 2), "ref_us": round(t_old, 2), "bytes": 0, "kernel_GBps": 0.0,
                 "saved_ms_per_prefill_40_layers": round(40 * (t_old - t_new) / 1e3, 2), **extra})  # fmt: skip
    print(json.dumps(ROWS[-1]), flush=True)
