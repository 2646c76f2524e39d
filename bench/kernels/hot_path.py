# ruff: noqa: B023  (every timed closure runs inside its own loop iteration)
"""Time the hot-path Triton kernels against their torch references (and fla-core where it applies) at
the real Qwen3.6-27B geometry, on one GPU. Small decode kernels are timed as CUDA-graph replays
(``triton.testing.do_bench_cudagraph``), so launch overhead is excluded; references (which sync) are
timed eagerly. Writes one JSON (``--json``) with date, GPU, commit and every row.

    python bench/kernels/hot_path.py --json bench/results/kernels_h200_<date>.json
    python bench/kernels/hot_path.py --linear-only --json ...  # the Triton GEMV vs cuBLAS + its tile sweep
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.model.mlp import SparseMoeBlock, _expert_groups, _experts_gathered, _experts_grouped  # noqa: E402
from engine.testing.synthetic import GEOMETRIES  # noqa: E402
from kernels.activation import (  # noqa: E402
    SigmoidGateMulTiles,
    SiluMulTiles,
    _launch_sigmoid_gate_mul,
    _launch_silu_mul,
    sigmoid_gate_mul,
    sigmoid_gate_mul_ref,
    silu_mul,
    silu_mul_ref,
)
from kernels.attention import (  # noqa: E402
    DECODE_MAX_SPLITS,
    PrefillTiles,
    _launch_paged_prefill_attention,
    kv_int8_group_size,
    paged_attention_decode,
    paged_attention_decode_ref,
    paged_prefill_attention,
    quantize_kv_int8_ref,
    store_kv,
    store_kv_ref,
)
from kernels.conv import (  # noqa: E402
    _launch_causal_conv1d_varlen,
    causal_conv1d_decode,
    causal_conv1d_decode_ref,
    causal_conv1d_varlen,
    causal_conv1d_varlen_ref,
    causal_conv1d_varlen_split,
)
from kernels.gdn import (  # noqa: E402
    chunk_gated_delta_rule,
    chunk_gated_delta_rule_ref,
    gated_delta_rule_decode,
    gated_delta_rule_decode_ref,
    gdn_gate_ref,
)
from kernels.linear import MIN_PROGRAMS, GemvTiles, _launch_linear, gemv_tiles, linear_ref  # noqa: E402
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
from kernels.norm import add_rms_norm, add_rms_norm_ref, gated_rms_norm, gated_rms_norm_ref  # noqa: E402
from kernels.rope import apply_rope_qk, apply_rope_qk_ref, apply_rope_ref, rope_cos_sin_ref  # noqa: E402

DEV = "cuda"
BF16 = torch.bfloat16
HIDDEN, HK, HV, DK, DV, CONV_K = 5120, 16, 48, 128, 128, 4  # Qwen3.6-27B
HQ, HKV, HEAD_DIM, PAGE = 24, 4, 256, 64
ROWS: list[dict] = []


def _us(fn: Callable[[], object], graph: bool) -> float:
    if graph:
        try:
            return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3
        except Exception as exc:  # noqa: BLE001 - a reference that syncs cannot be captured: time it eagerly
            print(f"  (graph capture failed: {type(exc).__name__}; timing eagerly)")
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def _row(op: str, shape: str, nbytes: float, kernel: Callable[[], object], ref: Callable[[], object] | None,
         extra: dict | None = None) -> None:  # fmt: skip
    t_k = _us(kernel, graph=True)
    t_r = _us(ref, graph=False) if ref is not None else None
    row = {"op": op, "shape": shape, "kernel_us": round(t_k, 2), "ref_us": round(t_r, 2) if t_r else None,
           "bytes": int(nbytes), "kernel_GBps": round(nbytes / t_k / 1e3, 1), **(extra or {})}  # fmt: skip
    ROWS.append(row)
    print(json.dumps(row), flush=True)


def _err(actual: torch.Tensor, expected: torch.Tensor) -> dict:
    a, b = actual.double(), expected.double()
    rel = ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()).item()
    return {"max_abs_err": float(f"{(a - b).abs().max().item():.3e}"), "rel_rms_err": float(f"{rel:.3e}")}


def bench_norms() -> None:
    for rows in (1, 8, 7680):
        x, res = (torch.randn(rows, HIDDEN, device=DEV, dtype=BF16) for _ in range(2))
        w = torch.randn(HIDDEN, device=DEV, dtype=BF16) * 0.1
        err = _err(add_rms_norm(x, res, w, 1e-6)[0], add_rms_norm_ref(x, res, w, 1e-6)[0])
        _row("add_rms_norm", f"{rows}x{HIDDEN}", 4 * x.numel() * 2, lambda: add_rms_norm(x, res, w, 1e-6),
             lambda: add_rms_norm_ref(x, res, w, 1e-6), err)  # fmt: skip
        core, z = (torch.randn(rows, HV, DV, device=DEV, dtype=BF16) for _ in range(2))
        wg = torch.ones(DV, device=DEV, dtype=BF16)
        err = _err(gated_rms_norm(core, z, wg, 1e-6), gated_rms_norm_ref(core, z, wg, 1e-6))
        _row("gated_rms_norm", f"{rows}x{HV}x{DV}", 3 * core.numel() * 2, lambda: gated_rms_norm(core, z, wg, 1e-6),
             lambda: gated_rms_norm_ref(core, z, wg, 1e-6), err)  # fmt: skip


# (BLOCK_ROWS, BLOCK_COLS, warps) of the 7680 x 17408 sweep; silu_mul_tiles' default is (1, 1024, 4)
SILU_MUL_TILES = ((1, 512, 4), (1, 1024, 4), (1, 1024, 8), (2, 1024, 8), (4, 1024, 8), (1, 2048, 8), (1, 4096, 8))  # fmt: skip


def bench_silu_mul() -> None:
    """The dense MLP's gated activation (27B: I = 17408) at T = 1, 8 (decode) and 7680 (a prefill chunk), and
    the 35B-A3B shared expert's I_s = 512 at 7680: ``silu_mul`` (one kernel: read gate, read up, write out)
    against the eager ``F.silu(gate) * up`` it replaces (two kernels, the bf16 silu written and read back).
    Bytes = the fused kernel's 3 x T x I x 2 for both, so kernel_GBps and ref_GBps compare directly (the eager
    pair moves 5/3 of that). ``ref_graph_us``: the eager pair replayed as a graph, what a decode step pays;
    ``torch_add_us``: ``torch.add`` over the same bytes (two reads, one write), torch's elementwise roofline.
    At 7680 x 17408 a tile sweep (``SiluMulTiles``: rows, columns, warps)."""
    for tokens, inter in ((1, 17408), (8, 17408), (7680, 17408), (7680, 512)):
        gate, up = (torch.randn(tokens, inter, device=DEV, dtype=BF16) for _ in range(2))
        nbytes = 3 * gate.numel() * 2
        out = silu_mul(gate, up)
        eager = F.silu(gate) * up
        extra = _err(out, silu_mul_ref(gate, up))
        extra.update({f"eager_{key}": value for key, value in _err(out, eager).items()})
        extra["frac_differs_from_eager"] = round((out != eager).float().mean().item(), 4)
        extra["ref_graph_us"] = round(_us(lambda: F.silu(gate) * up, graph=True), 2)
        added = torch.empty_like(gate)
        extra["torch_add_us"] = round(_us(lambda: torch.add(gate, up, out=added), graph=True), 2)
        shape = f"T{tokens} I{inter}"
        _row("silu_mul", shape, nbytes, lambda: silu_mul(gate, up), lambda: F.silu(gate) * up, extra)
        rates = {"ref_GBps": round(nbytes / ROWS[-1]["ref_us"] / 1e3, 1),
                 "ref_graph_GBps": round(nbytes / extra["ref_graph_us"] / 1e3, 1),
                 "torch_add_GBps": round(nbytes / extra["torch_add_us"] / 1e3, 1)}  # fmt: skip
        ROWS[-1].update(rates)
        print(json.dumps(rates), flush=True)
        if (tokens, inter) != (7680, 17408):
            continue
        _elementwise_sweep("silu_mul", shape, nbytes, SILU_MUL_TILES,
                           lambda tiles: _launch_silu_mul(gate, up, SiluMulTiles(*tiles)))  # fmt: skip


def _elementwise_sweep(op: str, shape: str, nbytes: float, sweep: tuple[tuple[int, int, int], ...],
                       launch: Callable[[tuple[int, int, int]], object]) -> None:  # fmt: skip
    """One graph-timed row per (BLOCK_ROWS, BLOCK_COLS, warps) tile of an elementwise kernel's sweep."""
    for tiles in sweep:
        t = _us(lambda: launch(tiles), graph=True)
        block_rows, block_cols, warps = tiles
        ROWS.append({"op": f"{op} BLOCK_ROWS={block_rows} BLOCK_COLS={block_cols} warps={warps}",
                     "shape": shape, "kernel_us": round(t, 2), "ref_us": None, "bytes": nbytes,
                     "kernel_GBps": round(nbytes / t / 1e3, 1)})  # fmt: skip
        print(json.dumps(ROWS[-1]), flush=True)


# (BLOCK_ROWS, BLOCK_COLS, warps) of the sweep at T = 1 and 7680; sigmoid_gate_mul_tiles' default at D = 256
# is (4, 256, 4)
SIGMOID_GATE_TILES = ((1, 256, 2), (2, 256, 4), (4, 256, 4), (4, 256, 8), (8, 256, 8), (16, 256, 8))


def bench_sigmoid_gate_mul() -> None:
    """Attention's output gate at 27B (24 heads x 256, 16 full-attention layers): ``sigmoid_gate_mul`` (one
    kernel: read x, read the gate view of the fused qkv output in place, write out) against the eager
    ``x * torch.sigmoid(gate.float()).to(x.dtype)`` it replaces (cast, sigmoid, cast, mul). T = 1 and 8 are
    decode steps, timed as CUDA-graph replays on both sides (``ref_us`` then is what a graphed step paid,
    ``kernel_eager_us`` beside); T = 7680 a prefill chunk, timed eagerly on both sides as the engine runs
    prefill (``kernel_graph_us`` beside).
    Bytes = the fused kernel's 3 x T x H x D x 2; ``saved_us_per_step``: the 27B's attention layers times the
    difference. A tile sweep (``SigmoidGateMulTiles``) at T = 1 and 7680, graph-timed."""
    layers = sum(t == "full_attention" for t in GEOMETRIES["qwen3.6-27b"].layer_types)
    fused_width = 2 * HQ * HEAD_DIM + 2 * HKV * HEAD_DIM
    for tokens in (1, 8, 7680):
        fused = torch.randn(tokens, fused_width, device=DEV, dtype=BF16)
        q = fused.split([2 * HQ * HEAD_DIM, 2 * HKV * HEAD_DIM], dim=-1)[0]
        gate = q.view(tokens, HQ, 2 * HEAD_DIM).chunk(2, dim=-1)[1]  # as GatedAttention: strides (row, 2D, 1)
        x = torch.randn(tokens, HQ, HEAD_DIM, device=DEV, dtype=BF16)
        nbytes = 3 * x.numel() * 2
        decode = tokens <= 8

        def eager() -> torch.Tensor:
            return x * torch.sigmoid(gate.float()).to(x.dtype)

        out = sigmoid_gate_mul(x, gate)
        extra = _err(out, sigmoid_gate_mul_ref(x, gate))
        extra.update({f"eager_{key}": value for key, value in _err(out, eager()).items()})
        extra["frac_differs_from_eager"] = round((out != eager()).float().mean().item(), 4)
        t_k = _us(lambda: sigmoid_gate_mul(x, gate), graph=decode)
        t_r = _us(eager, graph=decode)
        extra["kernel_graph_us" if not decode else "kernel_eager_us"] = round(
            _us(lambda: sigmoid_gate_mul(x, gate), graph=not decode), 2
        )
        extra["saved_us_per_step"] = round(layers * (t_r - t_k), 2)
        shape = f"T{tokens} H{HQ} D{HEAD_DIM}"
        ROWS.append({"op": f"sigmoid_gate_mul ({'graph' if decode else 'eager'} vs eager expression)",
                     "shape": shape, "kernel_us": round(t_k, 2), "ref_us": round(t_r, 2), "bytes": nbytes,
                     "kernel_GBps": round(nbytes / t_k / 1e3, 1), "ref_GBps": round(nbytes / t_r / 1e3, 1),
                     "layers": layers, **extra})  # fmt: skip
        print(json.dumps(ROWS[-1]), flush=True)
        if tokens == 8:
            continue
        _elementwise_sweep("sigmoid_gate_mul", shape, nbytes, SIGMOID_GATE_TILES,
                           lambda tiles: _launch_sigmoid_gate_mul(x, gate, SigmoidGateMulTiles(*tiles)))  # fmt: skip


def bench_conv_and_gdn_decode(fla_recurrent: Callable | None) -> None:
    channels = 2 * HK * DK + HV * DV
    for batch in (1, 8):
        slots = torch.arange(batch, device=DEV, dtype=torch.int32)
        keep = torch.ones(batch, dtype=torch.bool, device=DEV)
        x = torch.randn(batch, channels, device=DEV, dtype=BF16)
        wc = torch.randn(channels, CONV_K, device=DEV, dtype=BF16)
        conv_pool = torch.randn(batch + 1, channels, CONV_K - 1, device=DEV, dtype=BF16)
        p1, p2 = conv_pool.clone(), conv_pool.clone()
        err = _err(
            causal_conv1d_decode(x, wc, p1, slots, keep), causal_conv1d_decode_ref(x, wc, p2, slots, keep)
        )
        err["state_bit_exact"] = bool(torch.equal(p1, p2))
        _row("causal_conv1d_decode", f"B{batch} C{channels}", batch * channels * (2 + 2 * 3 * 2) * 2 + wc.numel() * 2,
             lambda: causal_conv1d_decode(x, wc, conv_pool, slots, keep),
             lambda: causal_conv1d_decode_ref(x, wc, conv_pool, slots, keep), err)  # fmt: skip
        q = x[:, : HK * DK].view(batch, HK, DK)
        k = x[:, HK * DK : 2 * HK * DK].view(batch, HK, DK)
        v = x[:, 2 * HK * DK :].view(batch, HV, DV)
        a, b = (torch.randn(batch, HV, device=DEV, dtype=BF16) for _ in range(2))
        A_log, dt_bias = torch.randn(HV, device=DEV) * 0.5, torch.randn(HV, device=DEV) * 0.5
        pool = torch.randn(batch + 1, HV, DK, DV, device=DEV) * 0.01
        state_bytes = 2 * batch * HV * DK * DV * 4
        extra = {}
        if fla_recurrent is not None:
            g, beta = gdn_gate_ref(a, b, A_log, dt_bias)
            qf, kf, vf = q.contiguous()[:, None], k.contiguous()[:, None], v.contiguous()[:, None]
            init = pool[:batch].clone()

            def fla_step() -> object:
                return fla_recurrent(qf, kf, vf, g[:, None], beta[:, None], initial_state=init,
                                     output_final_state=True, use_qk_l2norm_in_kernel=True)  # fmt: skip

            extra["fla_fused_recurrent_us"] = round(_us(fla_step, graph=True), 2)
            extra["fla_fused_recurrent_eager_us"] = round(_us(fla_step, graph=False), 2)
        p1, p2 = pool.clone(), pool.clone()
        o1 = gated_delta_rule_decode(q, k, v, a, b, A_log, dt_bias, p1, slots, keep)
        o2 = gated_delta_rule_decode_ref(q, k, v, a, b, A_log, dt_bias, p2, slots, keep)
        extra.update(_err(o1, o2))
        extra["state_rel_rms_err"] = _err(p1, p2)["rel_rms_err"]
        extra["kernel_eager_us"] = round(
            _us(
                lambda: gated_delta_rule_decode(q, k, v, a, b, A_log, dt_bias, pool, slots, keep), graph=False
            ),
            2,
        )
        _row("gated_delta_rule_decode", f"B{batch} {HK}/{HV}x{DK}", state_bytes,
             lambda: gated_delta_rule_decode(q, k, v, a, b, A_log, dt_bias, pool, slots, keep),
             lambda: gated_delta_rule_decode_ref(q, k, v, a, b, A_log, dt_bias, pool, slots, keep), extra)  # fmt: skip
        # 48 layers' states (> L2), one after another as in a decode step: the per-layer cost from HBM
        pools = [torch.randn_like(pool) * 0.01 for _ in range(48)]

        def all_layers() -> None:
            for layer_pool in pools:
                gated_delta_rule_decode(q, k, v, a, b, A_log, dt_bias, layer_pool, slots, keep)

        t48 = _us(all_layers, graph=True) / 48
        ROWS.append({"op": "gated_delta_rule_decode x48 layers", "shape": f"B{batch}", "kernel_us": round(t48, 2),
                     "ref_us": None, "bytes": state_bytes, "kernel_GBps": round(state_bytes / t48 / 1e3, 1)})  # fmt: skip
        print(json.dumps(ROWS[-1]), flush=True)


def bench_gdn_prefill(tokens: int) -> None:
    q, k = (torch.randn(1, tokens, HK, DK, device=DEV, dtype=BF16) for _ in range(2))
    v = torch.randn(1, tokens, HV, DV, device=DEV, dtype=BF16)
    g = -F.softplus(torch.randn(1, tokens, HV, device=DEV)) * 0.5
    beta = torch.rand(1, tokens, HV, device=DEV, dtype=BF16)
    init = torch.randn(1, HV, DK, DV, device=DEV) * 0.1
    out, state = chunk_gated_delta_rule(q, k, v, g, beta, init)
    ref_out, ref_state = chunk_gated_delta_rule_ref(q, k, v, g, beta, init)

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        a, b = a.double(), b.double()
        return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()).item()

    extra = {"out_rel_rms": rel(out, ref_out), "state_rel_rms": rel(state, ref_state),
             "out_max_abs": (out.double() - ref_out.double()).abs().max().item()}  # fmt: skip
    t_ref = triton.testing.do_bench(
        lambda: chunk_gated_delta_rule_ref(q, k, v, g, beta, init), warmup=1, rep=1
    )
    extra["ref_ms_single_run"] = round(t_ref, 2)
    _row("chunk_gated_delta_rule(fla)", f"T{tokens} {HK}/{HV}x{DK}", (q.numel() * 2 + v.numel() * 2) * 2,
         lambda: chunk_gated_delta_rule(q, k, v, g, beta, init), None, extra)  # fmt: skip


def bench_prefill_conv(tokens: int, continued: bool) -> None:
    """The GDN prefill conv at one sequence of ``tokens`` (C = 10240, K = 4): the Triton varlen kernel as
    the model calls it (q | k | v split outputs) and unsplit, against the torch reference and against the
    previous cuDNN path (history cat + depthwise conv1d + silu + the .contiguous() copies of q, k, v)."""
    channels, split = 2 * HK * DK + HV * DV, (HK * DK, HK * DK, HV * DV)
    x = torch.randn(tokens, channels, device=DEV, dtype=BF16)
    wc = torch.randn(channels, CONV_K, device=DEV, dtype=BF16) * 0.5
    pool = torch.randn(2, channels, CONV_K - 1, device=DEV, dtype=BF16)
    cu = torch.tensor([0, tokens], device=DEV, dtype=torch.int32)
    slots = torch.tensor([1], device=DEV)
    keep = torch.tensor([continued], device=DEV)
    p1, p2 = pool.clone(), pool.clone()
    err = _err(
        causal_conv1d_varlen(x, wc, p1, cu, slots, keep), causal_conv1d_varlen_ref(x, wc, p2, cu, slots, keep)
    )
    err["state_bit_exact"] = bool(torch.equal(p1, p2))

    def cudnn_path() -> object:
        prev = pool[1] if continued else pool.new_zeros(channels, CONV_K - 1)
        history = torch.cat([prev, x.t()], dim=1)
        pool[1] = history[:, history.shape[1] - (CONV_K - 1) :]
        mixed = F.silu(F.conv1d(history.unsqueeze(0), wc.unsqueeze(1), groups=channels)[0].t().contiguous())
        return [part.contiguous() for part in mixed.split(list(split), dim=-1)]

    err["cudnn_path_us"] = round(_us(cudnn_path, graph=False), 2)
    err["unsplit_kernel_us"] = round(
        _us(lambda: causal_conv1d_varlen(x, wc, pool, cu, slots, keep), graph=True), 2
    )
    shape = f"T{tokens} C{channels}{' continued' if continued else ''}"
    _row("causal_conv1d_varlen_split", shape, 2 * x.numel() * 2,
         lambda: causal_conv1d_varlen_split(x, wc, pool, cu, slots, keep, split),
         lambda: causal_conv1d_varlen_ref(x, wc, pool, cu, slots, keep), err)  # fmt: skip
    if continued:
        return
    for block_t, block_c, warps in ((16, 128, 4), (32, 128, 4), (32, 128, 8), (64, 128, 8), (32, 256, 8)):
        t = _us(lambda: _launch_causal_conv1d_varlen(x, wc, pool, cu, slots, keep, split, "silu",
                                                     block_t, block_c, warps), graph=True)  # fmt: skip
        ROWS.append({"op": f"causal_conv1d_varlen_split BLOCK_T={block_t} BLOCK_C={block_c} warps={warps}",
                     "shape": shape, "kernel_us": round(t, 2), "ref_us": None, "bytes": 2 * x.numel() * 2,
                     "kernel_GBps": round(2 * x.numel() * 2 / t / 1e3, 1)})  # fmt: skip
        print(json.dumps(ROWS[-1]), flush=True)


def bench_rope(tokens: int) -> None:
    """In-place RoPE on the attention layer's query/key (partial rotary 64 of 256) against the two
    out-of-place fp32 torch references the layer ran before."""
    query = torch.randn(tokens, HQ, HEAD_DIM, device=DEV, dtype=BF16)
    key = torch.randn(tokens, HKV, HEAD_DIM, device=DEV, dtype=BF16)
    cos, sin = rope_cos_sin_ref(torch.arange(tokens, device=DEV), 64, 1e7, (11, 11, 10))
    q1, k1 = apply_rope_qk(query.clone(), key.clone(), cos, sin)
    q2, k2 = apply_rope_qk_ref(query.clone(), key.clone(), cos, sin)
    err = _err(torch.cat([q1.flatten(), k1.flatten()]), torch.cat([q2.flatten(), k2.flatten()]))
    nbytes = 2 * tokens * (HQ + HKV) * 64 * 2 + 2 * cos.numel() * 4  # rotary channels in and out, tables
    _row("apply_rope_qk", f"T{tokens} {HQ}/{HKV}x{HEAD_DIM} rot64", nbytes, lambda: apply_rope_qk(query, key, cos, sin),
         lambda: (apply_rope_ref(query, cos, sin), apply_rope_ref(key, cos, sin)), err)  # fmt: skip


def _int8_pages(shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Random int8 codes and fp16 group scales of an int8 KV cache (timing only: values do not matter)."""
    codes = torch.randint(-127, 128, shape, device=DEV, dtype=torch.int8)
    return codes, (torch.rand(*shape[:3], HEAD_DIM // kv_int8_group_size(HEAD_DIM), device=DEV) * 0.02).half()


def _decode_layers_rows(batch: int, seq: int, query: torch.Tensor, table: torch.Tensor, lens: torch.Tensor,
                        like: torch.Tensor, nbytes: int, nbytes_int8: int) -> None:  # fmt: skip
    """16 layers' caches (> L2) one after another, bf16 and int8 KV, over a sweep of the split cap.
    Each layer: (key_cache, key_scale, value_cache, value_scale); scales None for bf16."""
    scale = HEAD_DIM**-0.5
    caches = {
        "bf16": [(torch.randn_like(like), None, torch.randn_like(like), None) for _ in range(16)],
        "int8": [(*_int8_pages(like.shape), *_int8_pages(like.shape)) for _ in range(16)],
    }
    for kv, layers in caches.items():
        for max_splits in (16, 32, DECODE_MAX_SPLITS, 128):

            def all_layers() -> None:
                for kl, ks, vl, vs in layers:
                    paged_attention_decode(query, kl, vl, table, lens, scale, ks, vs, max_splits=max_splits)

            t16 = _us(all_layers, graph=True) / 16
            moved = nbytes if kv == "bf16" else nbytes_int8
            default = " (default)" if max_splits == DECODE_MAX_SPLITS else ""
            ROWS.append({"op": f"paged_attention_decode {kv} x16 layers max_splits={max_splits}{default}",
                         "shape": f"B{batch} L{seq}", "kernel_us": round(t16, 2), "ref_us": None, "bytes": moved,
                         "kernel_GBps": round(moved / t16 / 1e3, 1)})  # fmt: skip
            print(json.dumps(ROWS[-1]), flush=True)
    del caches


def bench_attention() -> None:
    """paged_attention_decode over bf16 and int8 KV (int8 = codes + one fp16 scale per 64 values), each row
    with its error against the reference and whether row 0 of the batch equals row 0 decoded alone (the
    batch invariance), then store_kv into bf16 and int8 pages."""
    scale = HEAD_DIM**-0.5
    num_scales = HEAD_DIM // kv_int8_group_size(HEAD_DIM)
    for batch, seq in ((1, 8192), (8, 8192), (1, 65536), (8, 32768)):
        max_pages = seq // PAGE
        num_pages = batch * max_pages
        kc, vc = (torch.randn(num_pages, PAGE, HKV, HEAD_DIM, device=DEV, dtype=BF16) for _ in range(2))
        (kc8, ks), (vc8, vs) = (quantize_kv_int8_ref(c, num_scales) for c in (kc, vc))
        table = torch.randperm(num_pages, device=DEV, dtype=torch.int32).view(batch, max_pages)
        lens = torch.randint(seq // 2, seq + 1, (batch,), device=DEV, dtype=torch.int32)
        lens[0] = seq
        query = torch.randn(batch, HQ, HEAD_DIM, device=DEV, dtype=BF16)
        num_keys = int(lens.sum().item())
        nbytes = 2 * num_keys * HKV * HEAD_DIM * 2
        nbytes_int8 = 2 * num_keys * HKV * (HEAD_DIM + 2 * num_scales)
        for kv, k_cache, v_cache, k_scale, v_scale, moved in (("bf16", kc, vc, None, None, nbytes),
                                                              ("int8", kc8, vc8, ks, vs, nbytes_int8)):  # fmt: skip
            args = (query, k_cache, v_cache, table, lens, scale, k_scale, v_scale)
            out = paged_attention_decode(*args)
            alone = paged_attention_decode(
                query[:1], k_cache, v_cache, table[:1], lens[:1], scale, k_scale, v_scale
            )
            ref, extra = None, {"row0_equals_alone": bool(torch.equal(out[:1], alone))}
            if seq <= 8192:
                ref = lambda: paged_attention_decode_ref(*args)  # noqa: E731
                extra.update(_err(out, ref()))
            _row(f"paged_attention_decode {kv}", f"B{batch} L{seq} {HQ}/{HKV}x{HEAD_DIM}", moved,
                 lambda: paged_attention_decode(*args), ref, extra)  # fmt: skip
        del kc8, vc8, ks, vs
        if seq <= 8192:
            _decode_layers_rows(batch, seq, query, table, lens, kc, nbytes, nbytes_int8)
        del kc, vc
    tokens = 7680
    key, value = (torch.randn(tokens, HKV, HEAD_DIM, device=DEV, dtype=BF16) for _ in range(2))
    kc, vc = (torch.randn(tokens // PAGE + 1, PAGE, HKV, HEAD_DIM, device=DEV, dtype=BF16) for _ in range(2))
    slots = torch.randperm(tokens, device=DEV)
    k2, v2 = kc.clone(), vc.clone()
    store_kv(key, value, kc, vc, slots)
    store_kv_ref(key, value, k2, v2, slots)
    exact = {"bit_exact": bool(torch.equal(kc, k2) and torch.equal(vc, v2))}
    _row("store_kv bf16", f"T{tokens} {HKV}x{HEAD_DIM}", 4 * key.numel() * 2, lambda: store_kv(key, value, kc, vc, slots),
         lambda: store_kv_ref(key, value, k2, v2, slots), exact)  # fmt: skip
    pages8 = [_int8_pages(kc.shape) for _ in range(2)]
    copies8 = [(c.clone(), s.clone()) for c, s in pages8]
    (kc8, ks), (vc8, vs) = pages8
    (k8r, ksr), (v8r, vsr) = copies8
    store_kv(key, value, kc8, vc8, slots, ks, vs)
    store_kv_ref(key, value, k8r, v8r, slots, ksr, vsr)
    exact = {"bit_exact": all(torch.equal(a, b) for a, b in ((kc8, k8r), (vc8, v8r), (ks, ksr), (vs, vsr)))}
    _row("store_kv int8", f"T{tokens} {HKV}x{HEAD_DIM}", 2 * key.numel() * (2 + 1) + 2 * tokens * HKV * num_scales * 2,
         lambda: store_kv(key, value, kc8, vc8, slots, ks, vs),
         lambda: store_kv_ref(key, value, k8r, v8r, slots, ksr, vsr), exact)  # fmt: skip


# ---- Prefill attention: one chunk after a cached prefix, 27B geometry ------------------------------------

PREFILL_CHUNK = 8192
PREFILL_CACHED = (0, 32768, 100_000)
# tile sweep (PrefillTiles: BLOCK_M rows, BLOCK_N keys, warps, stages) at 32k cached, bf16 and int8 KV; shapes
# that do not fit the shared memory are reported as failed rows
PREFILL_TILE_SWEEP = ((128, 64, 8, 2), (128, 64, 8, 3), (128, 32, 8, 3), (128, 32, 8, 2), (64, 64, 4, 2),
                      (64, 64, 4, 3), (64, 32, 4, 3))  # fmt: skip


def _prefill_sdpa_previous(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                           page_table: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                           scale: float) -> torch.Tensor:  # fmt: skip
    """The attention layer's previous prefill path (before paged_prefill_attention): one host sync for the
    bounds, then per sequence flash SDPA over the chunk's own K/V when nothing is cached before it, else its
    pages gathered, repeated to the query heads and SDPA with a lower-right causal mask."""
    from torch.nn.attention.bias import causal_lower_right

    bounds, lens = query_start_loc.tolist(), seq_lens.tolist()
    group = query.shape[1] // key_cache.shape[2]
    out = torch.empty_like(query)
    for b, total in enumerate(lens):
        start, end = bounds[b], bounds[b + 1]
        q = query[start:end].transpose(0, 1).unsqueeze(0)  # [1, Hq, q_len, D]
        pages = page_table[b, : -(-total // PAGE)].long()
        rows = [
            c[pages].flatten(0, 1)[:total].transpose(0, 1) for c in (key_cache, value_cache)
        ]  # [Hkv, L, D]
        if total == end - start:  # (the layer took these from its own new K/V, not the pages)
            k, v = (r.unsqueeze(0) for r in rows)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
        else:
            k, v = (r.repeat_interleave(group, dim=0).unsqueeze(0) for r in rows)
            o = F.scaled_dot_product_attention(
                q, k, v, attn_mask=causal_lower_right(end - start, total), scale=scale
            )
        out[start:end] = o[0].transpose(0, 1)
    return out


def _prefill_row(op: str, shape: str, flops: float, nbytes: float, fn: Callable[[], object],
                 extra: dict | None = None) -> float | None:  # fmt: skip
    """One timed row with TFLOP/s (graph replay when it captures, else eager); None when the launch fails."""
    try:
        fn()  # compiles; a tile shape over the shared memory fails here, before any graph capture
        t = _us(fn, graph=True)
    except Exception as exc:  # noqa: BLE001 - a tile shape that does not fit: a row saying so, not a crash
        ROWS.append({"op": op, "shape": shape, "kernel_us": float("nan"), "ref_us": None, "bytes": int(nbytes),
                     "kernel_GBps": float("nan"), "error": f"{type(exc).__name__}: {exc}"[:300]})  # fmt: skip
        print(json.dumps(ROWS[-1]), flush=True)
        return None
    ROWS.append({"op": op, "shape": shape, "kernel_us": round(t, 2), "ref_us": None, "bytes": int(nbytes),
                 "kernel_GBps": round(nbytes / t / 1e3, 1), "kernel_TFLOPs": round(flops / t / 1e6, 1),
                 **(extra or {})})  # fmt: skip
    print(json.dumps(ROWS[-1]), flush=True)
    return t


def bench_prefill_attention() -> None:
    """paged_prefill_attention on one 8,192-token chunk after 0, 32k and 100k cached tokens (27B: 24 q / 4 kv
    heads x 256, pages of 64), against the previous path (SDPA per sequence over gathered, repeated pages),
    with TFLOP/s of each (causal FLOPs: 4 * Hq * D * sum over query rows of the keys each sees); then int8 KV,
    and the tile sweep at 32k. Bytes = the sequence's K/V read once (what an ideal kernel moves from HBM)."""
    scale = HEAD_DIM**-0.5
    num_scales = HEAD_DIM // kv_int8_group_size(HEAD_DIM)
    q_len = PREFILL_CHUNK
    for cached in PREFILL_CACHED:
        total = cached + q_len
        num_pages = -(-total // PAGE)
        kc, vc = (torch.randn(num_pages, PAGE, HKV, HEAD_DIM, device=DEV, dtype=BF16) for _ in range(2))
        table = torch.randperm(num_pages, device=DEV, dtype=torch.int32).view(1, num_pages)
        cu = torch.tensor([0, q_len], device=DEV, dtype=torch.int32)
        lens = torch.tensor([total], device=DEV, dtype=torch.int32)
        query = torch.randn(q_len, HQ, HEAD_DIM, device=DEV, dtype=BF16)
        flops = 4 * HQ * HEAD_DIM * (q_len * cached + q_len * (q_len + 1) / 2)
        nbytes = 2 * total * HKV * HEAD_DIM * 2
        shape = f"chunk {q_len} after {cached} {HQ}/{HKV}x{HEAD_DIM}"
        args = (query, kc, vc, table, cu, lens, scale)
        out = paged_prefill_attention(*args)
        previous = _prefill_sdpa_previous(*args)
        t_prev = _us(lambda: _prefill_sdpa_previous(*args), graph=False)
        extra = {"vs_previous": _err(out, previous), "previous_us": round(t_prev, 2),
                 "previous_TFLOPs": round(flops / t_prev / 1e6, 1)}  # fmt: skip
        t = _prefill_row("paged_prefill_attention bf16", shape, flops, nbytes, lambda: paged_prefill_attention(*args),
                         extra)  # fmt: skip
        if t is not None:
            ROWS[-1]["ref_us"] = round(t_prev, 2)  # the previous path in the ref column
            ROWS[-1]["speedup_vs_previous"] = round(t_prev / t, 2)
        del previous
        (kc8, ks), (vc8, vs) = (quantize_kv_int8_ref(c, num_scales) for c in (kc, vc))
        args8 = (query, kc8, vc8, table, cu, lens, scale, ks, vs)
        extra = {"vs_bf16_kernel": _err(paged_prefill_attention(*args8), out)}
        _prefill_row("paged_prefill_attention int8", shape, flops, nbytes / 2, lambda: paged_prefill_attention(*args8),
                     extra)  # fmt: skip
        if cached == 32768:
            for kv, sweep_args in (("bf16", args + (None, None)), ("int8", args8)):
                for tiles in map(PrefillTiles._make, PREFILL_TILE_SWEEP):
                    _prefill_row(
                        f"paged_prefill_attention {kv} BLOCK_M={tiles.block_m} BLOCK_N={tiles.block_n} "
                        f"warps={tiles.num_warps} stages={tiles.num_stages}", shape, flops, nbytes,
                        lambda: _launch_paged_prefill_attention(*sweep_args, tiles=tiles),
                    )  # fmt: skip
        del kc, vc, kc8, vc8, ks, vs, out
        torch.cuda.empty_cache()


# ---- MoE: the routed experts at the Qwen3.6-35B-A3B geometry ----------------------------------------------

MOE_E, MOE_TOPK, MOE_H, MOE_I = 256, 8, 2048, 512  # Qwen3.6-35B-A3B: experts, top-k, hidden, inter
MOE_LAYERS = 32  # routings timed back to back in one graph, as a decode step runs its layers (> L2 together)
# tile sweeps (MoeTiles fields of the kernel in question; the other kernel keeps moe_tiles' choice)
GATE_UP_TILES = ((16, 512, 8), (8, 1024, 8), (8, 512, 4), (16, 256, 4), (4, 2048, 8), (32, 256, 8))
DOWN_TILES = ((4, 512, 8), (2, 512, 4), (8, 512, 8), (4, 256, 4), (8, 256, 8), (1, 512, 4))


def _read_us() -> float:
    """Microseconds to read 2 GiB (an fp32 sum, the best of the runs, as ninfer-bench measures bandwidth)."""
    x = torch.empty(1 << 29, device=DEV).uniform_()
    return triton.testing.do_bench(x.sum, warmup=5, rep=200, return_mode="min") * 1e3


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
    - ``moe_combine`` (+ the shared expert's output) over the grouped buffer ``_expert_groups`` lays out
      (65280 rows, each token's 8 rows scattered over it) vs its reference; bytes = the T x 8 bf16 rows read +
      shared read + out written; ``previous_us``: the fp32 gather, weight multiply and index_add_ it replaces;
    - ``_experts_grouped`` (route excluded: grouping, gather, 2 grouped GEMMs, silu_mul, combine) timed eagerly
      as the engine runs prefill, against the previous implementation (``ref_us``), bit-for-bit not expected
      (one rounding instead of two)."""
    tokens = MOE_PREFILL_TOKENS
    x = torch.randn(tokens, MOE_H, device=DEV, dtype=BF16)
    shared = torch.randn(tokens, MOE_H, device=DEV, dtype=BF16) * 0.1
    weights, ids = moe_route(torch.randn(tokens, MOE_E, device=DEV, dtype=BF16), MOE_TOPK)
    groups = _expert_groups(ids, MOE_E)
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


# ---- Linear layers: the Triton GEMV (kernels/linear.py) vs cuBLAS at decode batch sizes -----------------------

LINEAR_WORKING_SET = 1 << 30  # distinct weight bytes cycled per timed call (each call misses the 60 MB L2)
LINEAR_MAX_COPIES = 128
LINEAR_TOKENS = (1, 8)
# (BLOCK_N, BLOCK_K in bf16 elements, num_warps, num_stages) tried on every shape, each with the split-K that
# gemv_tiles' rule gives for that tile, half and (for N <= 6144) twice that; the first is gemv_tiles' default.
# BLOCK_N 16 / 32 run mma.sync (also on sm_120), 64 / 128 Hopper's wgmma.
LINEAR_TILE_SWEEP = ((32, 256, 4, 4), (16, 256, 4, 4), (32, 128, 4, 6), (32, 512, 4, 3), (64, 128, 4, 4),
                     (64, 256, 4, 3), (128, 128, 8, 3))  # fmt: skip


def _linear_shapes() -> list[tuple[str, str, int, int, int]]:
    """(geometry, projection, N, K, calls per decode step) for every dense linear of a decode step of the two
    geometries (engine/testing/synthetic.py GEOMETRIES, fused as the loader fuses them; the MTP head not counted);
    shapes that coincide (35B-A3B o_proj and GDN out_proj) are one entry with their calls summed."""
    shapes: dict[tuple[str, int, int], list] = {}
    for geometry in ("qwen3.6-27b", "qwen3.6-35b-a3b"):
        c = GEOMETRIES[geometry]
        hidden, attn, gdn = c.hidden_size, c.num_attention_layers, c.num_linear_layers
        q_out = 2 * c.num_attention_heads * c.head_dim  # query + output gate per head
        kv_out = c.num_key_value_heads * c.head_dim
        entries = [
            ("attn qkv", q_out + 2 * kv_out, hidden, attn),
            ("attn o_proj", hidden, c.num_attention_heads * c.head_dim, attn),
            ("GDN in_proj", c.conv_dim + c.linear_value_dim + 2 * c.linear_num_value_heads, hidden, gdn),
            ("GDN out_proj", hidden, c.linear_value_dim, gdn),
        ]
        if c.is_moe:
            entries.append(("router", c.num_experts, hidden, c.num_hidden_layers))
        else:
            assert c.intermediate_size is not None
            entries += [("MLP gate_up", 2 * c.intermediate_size, hidden, c.num_hidden_layers),
                        ("MLP down", hidden, c.intermediate_size, c.num_hidden_layers)]  # fmt: skip
        entries.append(("lm_head", c.vocab_size, hidden, 1))
        for name, n, k, calls in entries:
            key = (geometry, n, k)
            if key in shapes:
                shapes[key][0] += f" / {name}"
                shapes[key][1] += calls
            else:
                shapes[key] = [name, calls]
    return [(g, name, n, k, calls) for (g, n, k), (name, calls) in shapes.items()]


# --linear-sweep small: the first tiles of LINEAR_TILE_SWEEP, each at its rule's split only
LINEAR_SWEEP_SMALL = 4


def _linear_sweep(n: int, k: int, small: bool = False) -> list[GemvTiles]:
    """The tiles tried on one [N, K] bf16 weight (``LINEAR_TILE_SWEEP`` x splits; see there), default first;
    ``small``: the first ``LINEAR_SWEEP_SMALL`` tiles at the rule's split only (a call of a few minutes)."""
    tried = [gemv_tiles(n, k, BF16)]
    for block_n, block_k, warps, stages in (
        LINEAR_TILE_SWEEP[:LINEAR_SWEEP_SMALL] if small else LINEAR_TILE_SWEEP
    ):
        block_k = min(block_k, max(16, 1 << (k - 1).bit_length()))
        split = 1
        while -(-n // block_n) * split < MIN_PROGRAMS and split < 16 and k % (2 * split * block_k) == 0:
            split *= 2
        splits = {split} if small else {split, max(1, split // 2)}
        if not small and n <= 6144 and k % (2 * split * block_k) == 0:
            splits.add(2 * split)
        tried += [GemvTiles(block_n, block_k, warps, s, stages) for s in sorted(splits)]
    return list(dict.fromkeys(tried))


def _bench_linear_shape(geometry: str, name: str, n: int, k: int, calls: int, read_gbps: float,
                        sweep: str) -> dict[int, tuple[float, float, float]]:  # fmt: skip
    """The rows of one [N, K] weight (see ``bench_linear``); {T: (us per call: GEMV default, best tile, cuBLAS)}."""
    nbytes = n * k * 2
    copies = max(1, min(LINEAR_MAX_COPIES, -(-LINEAR_WORKING_SET // nbytes)))
    weights = torch.randn(copies, n, k, device=DEV, dtype=BF16) * k**-0.5
    default = gemv_tiles(n, k, BF16)
    result = {}
    for tokens in LINEAR_TOKENS:
        shape = f"{geometry} {name} T{tokens} N{n} K{k}"
        x = torch.randn(tokens, k, device=DEV, dtype=BF16)
        out = _launch_linear(x, weights[0], default)  # the GEMV itself, whatever NINFER_GEMV=auto would pick
        check = {**_err(out, linear_ref(x, weights[0])), "tiles": list(default), "copies": copies,
                 "calls_per_step": calls, "read_GBps": round(read_gbps, 1)}  # fmt: skip
        if tokens > 1:
            check["batch_invariant"] = all(
                torch.equal(_launch_linear(x[i : i + 1], weights[0], default)[0], out[i])
                for i in range(tokens)
            )

        def per_layer(fn: Callable[[torch.Tensor], object]) -> float:
            def layers() -> None:
                for w in weights:
                    fn(w)

            layers()
            return _us(layers, graph=True) / copies

        t_cublas = per_layer(lambda w: F.linear(x, w))
        t_gemv = per_layer(lambda w: _launch_linear(x, w, default))
        row = {"op": "linear GEMV (default tiles) vs cuBLAS F.linear", "shape": shape, "kernel_us": round(t_gemv, 2),
               "ref_us": round(t_cublas, 2), "bytes": nbytes, "kernel_GBps": round(nbytes / t_gemv / 1e3, 1),
               "cublas_GBps": round(nbytes / t_cublas / 1e3, 1),
               "fraction_of_read": round(nbytes / t_gemv / 1e3 / read_gbps, 3),
               "cublas_fraction_of_read": round(nbytes / t_cublas / 1e3 / read_gbps, 3),
               "speedup_vs_cublas": round(t_cublas / t_gemv, 3), **check}  # fmt: skip
        ROWS.append(row)
        print(json.dumps(row), flush=True)
        best: tuple[float, GemvTiles] = (t_gemv, default)
        for tiles in _linear_sweep(n, k, small=sweep == "small")[1:] if sweep != "none" else []:
            err = _err(_launch_linear(x, weights[0], tiles), linear_ref(x, weights[0]))
            t = per_layer(lambda w: _launch_linear(x, w, tiles))
            ROWS.append({"op": f"linear GEMV sweep BLOCK_N={tiles.block_n} BLOCK_K={tiles.block_k} "
                         f"warps={tiles.num_warps} split={tiles.split_k} stages={tiles.num_stages}",
                         "shape": shape, "kernel_us": round(t, 2), "ref_us": round(t_cublas, 2), "bytes": nbytes,
                         "kernel_GBps": round(nbytes / t / 1e3, 1), "tiles": list(tiles),
                         "speedup_vs_cublas": round(t_cublas / t, 3), **err})  # fmt: skip
            print(json.dumps(ROWS[-1]), flush=True)
            best = min(best, (t, tiles))
        if sweep != "none":
            ROWS.append({"op": "linear GEMV best tile", "shape": shape, "kernel_us": round(best[0], 2),
                         "ref_us": round(t_cublas, 2), "bytes": nbytes, "kernel_GBps": round(nbytes / best[0] / 1e3, 1),
                         "tiles": list(best[1]), "is_default": best[1] == default,
                         "speedup_vs_cublas": round(t_cublas / best[0], 3)})  # fmt: skip
            print(json.dumps(ROWS[-1]), flush=True)
        result[tokens] = (t_gemv, best[0], t_cublas)
    return result


def bench_linear(sweep: str, only: str = "") -> None:
    """Every dense decode linear of 27B and 35B-A3B (``_linear_shapes``) at T = 1 and 8: the Triton GEMV
    (``linear``, gemv_tiles' default) against cuBLAS ``F.linear``, both as CUDA-graph replays over enough
    distinct copies of the weight (``LINEAR_WORKING_SET``) that every call reads its weight from HBM, as a
    decode step's layers do; time per call ("per layer"), bytes = the weight's, fraction of the measured read
    bandwidth. Each row checks the kernel against ``linear_ref`` and, at T=8, that every row is bitwise the
    row run alone. With ``sweep`` "small" or "full" (``--linear-only``, ``--linear-sweep``) the tile sweep
    (``_linear_sweep``) per shape and T and the best tile per shape. Last, per geometry and T, one decode step's dense linears summed (calls x us
    per call: GEMV default, best tile, cuBLAS): the numbers that decide whether ``NINFER_GEMV=auto`` stays the
    default and which tiles ``gemv_tiles`` should pick. ``only``: the shapes whose "geometry projection"
    contains it (all when empty), to split the sweep over several calls."""
    read_us = _read_us()
    read_gbps = (1 << 31) / read_us / 1e3
    ROWS.append({"op": "read bandwidth (fp32 sum)", "shape": "2 GiB", "kernel_us": round(read_us, 2),
                 "ref_us": None, "bytes": 1 << 31, "kernel_GBps": round(read_gbps, 1)})  # fmt: skip
    print(json.dumps(ROWS[-1]), flush=True)
    step: dict[tuple[str, int], list[float]] = {}
    for geometry, name, n, k, calls in _linear_shapes():
        if only not in f"{geometry} {name}":
            continue
        times = _bench_linear_shape(geometry, name, n, k, calls, read_gbps, sweep)
        torch.cuda.empty_cache()
        for tokens, per_call in times.items():
            totals = step.setdefault((geometry, tokens), [0.0, 0.0, 0.0])
            for i, t in enumerate(per_call):
                totals[i] += calls * t
    for (geometry, tokens), (gemv, best, cublas) in step.items():
        ROWS.append({"op": "linear: one decode step's dense linears (sum of calls x us per call)",
                     "shape": f"{geometry} T{tokens}", "kernel_us": round(gemv, 1), "ref_us": round(cublas, 1),
                     "bytes": 0, "kernel_GBps": 0.0, "best_tiles_us": round(best, 1),
                     "saved_ms_per_step_default": round((cublas - gemv) / 1e3, 3),
                     "saved_ms_per_step_best": round((cublas - best) / 1e3, 3)})  # fmt: skip
        print(json.dumps(ROWS[-1]), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--moe-only", action="store_true", help="only the MoE rows (35B-A3B geometry)")
    parser.add_argument(
        "--linear-only",
        action="store_true",
        help="only the linear rows: Triton GEMV vs cuBLAS, tile sweep (27B and 35B-A3B)",
    )
    parser.add_argument("--linear-sweep", default="full", choices=("none", "small", "full"),
                        help="with --linear-only: the tile sweep per shape (small: 4 tiles, rule splits)")  # fmt: skip
    parser.add_argument("--linear-shapes", default="", metavar="SUBSTR",
                        help="with --linear-only: the shapes whose 'geometry projection' contains SUBSTR")  # fmt: skip
    args = parser.parse_args()
    if args.moe_only and args.linear_only:
        parser.error("--moe-only and --linear-only exclude each other")
    torch.manual_seed(0)
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_recurrent
    except ImportError:
        fla_recurrent = None
    if args.linear_only:
        bench_linear(sweep=args.linear_sweep, only=args.linear_shapes)
    elif not args.moe_only:
        bench_norms()
        bench_silu_mul()
        bench_sigmoid_gate_mul()
        bench_conv_and_gdn_decode(fla_recurrent)
        if fla_recurrent is not None:
            bench_gdn_prefill(7680)
        bench_prefill_conv(7680, continued=False)
        bench_prefill_conv(8192, continued=True)  # a long-context chunk continuing from its conv state
        bench_rope(7680)
        bench_attention()
        bench_prefill_attention()
    if not args.linear_only:
        bench_moe()
    if not args.moe_only and not args.linear_only:
        bench_linear(sweep="none")  # the sweep (minutes) only with --linear-only
    commit = (
        os.environ.get("NINFER_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    )
    result = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "commit": commit,
        "software": {
            "torch": torch.__version__,
            "triton": triton.__version__,
            "fla": __import__("fla").__version__ if fla_recurrent else None,
        },  # fmt: skip
        "what": "hot-path Triton kernels vs torch references at the Qwen3.6-27B geometry; kernel times are "
        "median CUDA-graph replays (launch overhead excluded), ref times eager medians; GBps = bytes/time; "
        "MoE rows at the Qwen3.6-35B-A3B geometry",
        "rows": ROWS,
    }
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'op':30s} {'shape':26s} {'kernel us':>10s} {'ref us':>10s} {'GB/s':>8s}")
    for r in ROWS:
        print(
            f"{r['op']:30s} {r['shape']:26s} {r['kernel_us']:10.2f} {str(r['ref_us']):>10s} {r['kernel_GBps']:8.1f}"
        )


if __name__ == "__main__":
    main()
