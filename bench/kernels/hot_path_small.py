# ruff: noqa: B023  (every timed closure runs inside its own loop iteration)
"""bench/kernels/hot_path.py's rows for the small ops at the Qwen3.6-27B geometry: norms, silu_mul,
sigmoid_gate_mul, the conv and GDN decode steps, GDN and conv prefill, RoPE.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton.testing
from hot_path_common import (
    BF16,
    CONV_K,
    DEV,
    DK,
    DV,
    HEAD_DIM,
    HIDDEN,
    HK,
    HKV,
    HQ,
    HV,
    ROWS,
    _err,
    _row,
    _us,
)

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
from kernels.norm import add_rms_norm, add_rms_norm_ref, gated_rms_norm, gated_rms_norm_ref  # noqa: E402
from kernels.rope import apply_rope_qk, apply_rope_qk_ref, apply_rope_ref, rope_cos_sin_ref  # noqa: E402


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
