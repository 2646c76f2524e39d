# ruff: noqa: B023  (every timed closure runs inside its own loop iteration)
"""Time the hot-path Triton kernels against their torch references (and fla-core where it applies) at
the real Qwen3.6-27B geometry, on one GPU. Small decode kernels are timed as CUDA-graph replays
(``triton.testing.do_bench_cudagraph``), so launch overhead is excluded; references (which sync) are
timed eagerly. Writes one JSON (``--json``) with date, GPU, commit and every row.

    python bench/kernels/hot_path.py --json bench/results/kernels_h200_<date>.json
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

from kernels.attention import (  # noqa: E402
    paged_attention_decode,
    paged_attention_decode_ref,
    store_kv,
    store_kv_ref,
)
from kernels.conv import causal_conv1d_decode, causal_conv1d_decode_ref  # noqa: E402
from kernels.gdn import (  # noqa: E402
    chunk_gated_delta_rule,
    chunk_gated_delta_rule_ref,
    gated_delta_rule_decode,
    gated_delta_rule_decode_ref,
    gdn_gate_ref,
)
from kernels.norm import add_rms_norm, add_rms_norm_ref, gated_rms_norm, gated_rms_norm_ref  # noqa: E402

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


def bench_attention() -> None:
    scale = HEAD_DIM**-0.5
    for batch, seq in ((1, 8192), (8, 8192), (1, 65536), (8, 32768)):
        max_pages = seq // PAGE
        num_pages = batch * max_pages
        kc, vc = (torch.randn(num_pages, PAGE, HKV, HEAD_DIM, device=DEV, dtype=BF16) for _ in range(2))
        table = torch.randperm(num_pages, device=DEV, dtype=torch.int32).view(batch, max_pages)
        lens = torch.randint(seq // 2, seq + 1, (batch,), device=DEV, dtype=torch.int32)
        lens[0] = seq
        query = torch.randn(batch, HQ, HEAD_DIM, device=DEV, dtype=BF16)
        nbytes = 2 * int(lens.sum().item()) * HKV * HEAD_DIM * 2
        ref, extra = None, {}
        if seq <= 8192:
            ref = lambda: paged_attention_decode_ref(query, kc, vc, table, lens, scale)  # noqa: E731
            extra = _err(paged_attention_decode(query, kc, vc, table, lens, scale), ref())
        _row("paged_attention_decode", f"B{batch} L{seq} {HQ}/{HKV}x{HEAD_DIM}", nbytes,
             lambda: paged_attention_decode(query, kc, vc, table, lens, scale), ref, extra)  # fmt: skip
        if seq <= 8192:  # 16 layers' caches (> L2) and a split-count sweep
            caches = [(torch.randn_like(kc), torch.randn_like(vc)) for _ in range(16)]
            for splits in (None, 16, 32, 64, 128, 256):

                def all_layers() -> None:
                    for kl, vl in caches:
                        paged_attention_decode(query, kl, vl, table, lens, scale, splits)

                t16 = _us(all_layers, graph=True) / 16
                ROWS.append({"op": f"paged_attention_decode x16 layers splits={splits}", "shape": f"B{batch} L{seq}",
                             "kernel_us": round(t16, 2), "ref_us": None, "bytes": nbytes,
                             "kernel_GBps": round(nbytes / t16 / 1e3, 1)})  # fmt: skip
                print(json.dumps(ROWS[-1]), flush=True)
        del kc, vc
    tokens = 7680
    key, value = (torch.randn(tokens, HKV, HEAD_DIM, device=DEV, dtype=BF16) for _ in range(2))
    kc, vc = (torch.randn(tokens // PAGE + 1, PAGE, HKV, HEAD_DIM, device=DEV, dtype=BF16) for _ in range(2))
    slots = torch.randperm(tokens, device=DEV)
    k2, v2 = kc.clone(), vc.clone()
    store_kv(key, value, kc, vc, slots)
    store_kv_ref(key, value, k2, v2, slots)
    exact = {"bit_exact": bool(torch.equal(kc, k2) and torch.equal(vc, v2))}
    _row("store_kv", f"T{tokens} {HKV}x{HEAD_DIM}", 4 * key.numel() * 2, lambda: store_kv(key, value, kc, vc, slots),
         lambda: store_kv_ref(key, value, k2, v2, slots), exact)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_recurrent
    except ImportError:
        fla_recurrent = None
    bench_norms()
    bench_conv_and_gdn_decode(fla_recurrent)
    if fla_recurrent is not None:
        bench_gdn_prefill(7680)
    bench_attention()
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
        "median CUDA-graph replays (launch overhead excluded), ref times eager medians; GBps = bytes/time",
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
