# ruff: noqa: B023  (every timed closure runs inside its own loop iteration)
"""bench/kernels/hot_path.py's attention rows at the Qwen3.6-27B geometry: store_kv, paged decode
attention (bf16 and int8 caches), paged prefill attention and its tile sweep.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import torch
import torch.nn.functional as F
from hot_path_common import (
    BF16,
    DEV,
    HEAD_DIM,
    HKV,
    HQ,
    PAGE,
    ROWS,
    _err,
    _row,
    _us,
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
        for max_splits in (32, 64, 128, 256):  # DECODE_MAX_SPLITS is marked

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
