"""Decode attention over bf16 vs int8 KV at long context, Qwen3.6-27B geometry (24 query / 4 KV heads x 256, pages
of 64), batch 1 and 4: the launcher's defaults (64 splits, 32-key tiles, int8 dequantised in fp32), the candidate new
defaults (``kernels.attention.DECODE_NEW_DEFAULTS``: 128 splits; int8: 64-key tiles, ``int8_grouped``: one fp16 dot
per scale group on the raw codes, kernels/attention/decode_int8.py), the previous candidate (``candidate_f16``: the
same with the fp16 dequantisation, ``int8_f16``), the keys-major build of the grouped kernel (``candidate_km``:
``int8_keys_major``, keys as the MMAs' rows, 128 registers, 2 stages; ``NINFER_INT8_ATTENTION=keys_major``) and a
sweep of the tuning knobs (``max_splits``, ``block_n``, ``num_warps``, ``int8_f16``, ``int8_grouped``,
``int8_keys_major``, ``num_stages``, ``maxnreg``).

    python bench/kernels/decode_attention.py --json bench/results/decode_attention_h200_<date>.json \\
        [--context 100000] [--batch 1,4] [--layers 16] [--quick [--km-sweep]]

Each row times ``--layers`` layers' caches (each its own tensors, far larger than L2, so every call streams its
K/V from HBM) decoded one after another as one CUDA-graph replay (``triton.testing.do_bench_cudagraph``), and
reports microseconds per layer and the KV bytes a layer reads per second (int8: codes + fp16 scales). Every
configuration is first checked against ``paged_attention_decode_ref`` on layer 0 (``rel_rms_err``). The summary
gives int8 / bf16 time per layer at each batch, the default configurations and the best of the sweep: at or under
1.0 means int8 decode attention is at least as fast as bf16's.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import subprocess
from pathlib import Path

import torch
import triton
from hot_path_common import BF16, DEV, HEAD_DIM, HKV, HQ, PAGE, _err, _us

from kernels.attention import (
    DECODE_NEW_DEFAULTS,
    kv_int8_group_size,
    paged_attention_decode,
    paged_attention_decode_ref,
)

OLD = {
    "max_splits": 64,
    "block_n": 32,
    "num_warps": 4,
    "int8_f16": False,
    "int8_grouped": False,
    "int8_keys_major": False,
    "num_stages": None,
    "maxnreg": None,
}  # the launcher's defaults before int8_grouped (knob names)
CANDIDATES = ("candidate", "candidate_f16", "candidate_km")  # the int8 candidates; bf16 has one, "candidate"


def _candidate(kv: str, grouped: bool = True, keys_major: bool = False) -> dict:
    """DECODE_NEW_DEFAULTS as launcher knobs for ``kv``; ``grouped=False``: the previous int8 candidate (the fp16
    dequantisation instead of the grouped dots); ``keys_major``: the grouped kernel's keys-major build (whatever
    NINFER_INT8_ATTENTION says, each row names its build)."""
    knobs = {"max_splits": DECODE_NEW_DEFAULTS["max_splits"]}
    if kv == "int8":
        knobs |= {"block_n": DECODE_NEW_DEFAULTS["int8_block_n"], "int8_f16": DECODE_NEW_DEFAULTS["int8_f16"]}
        knobs |= {
            "int8_grouped": DECODE_NEW_DEFAULTS["int8_grouped"] and grouped,
            "int8_keys_major": keys_major,
        }
    return knobs


# the keys-major build's fixed knobs
KM_BUILD = {"int8_grouped": True, "int8_keys_major": True}


def _keys_major_sweep(splits: tuple[int, ...], tiles: tuple[int, ...]) -> list[dict]:
    """The keys-major build's register cap (0: none, ptxas's own count), pipeline depth, warps, tiles and splits."""
    return [
        {"max_splits": s, "block_n": n, "num_warps": w, **KM_BUILD, "num_stages": st, "maxnreg": r}
        for s, n, w, st, r in itertools.product(splits, tiles, (2, 4), (2, 3), (0, 128, 168))
    ]


# --quick --km-sweep: the keys-major build's candidate knobs varied one at a time. sm_90 AOT builds, loop instructions
# per 64 keys over all warps against 3452 for the candidate: no register cap (0: 142 registers, 3 programs an SM where
# 128 fit 4), a 168 cap, 3 stages, 2 warps (3124 in 184 registers), 128-key tiles (3222 in 128 registers, 3204 in
# 168; 88 KB of shared memory: 2 programs an SM)
KEYS_MAJOR_QUICK = [
    {"max_splits": 128, "block_n": n, "num_warps": w, **KM_BUILD, "num_stages": st, "maxnreg": r}
    for n, w, st, r in (
        (64, 4, 2, 0),
        (64, 4, 2, 168),
        (64, 4, 3, 128),
        (64, 2, 2, 0),
        (128, 4, 2, 128),
        (128, 4, 2, 168),
    )
]


def _sweep(kv: str, quick: bool, km_sweep: bool = False) -> list[dict]:
    """Knob settings to time (besides the defaults and OLD); ``km_sweep`` with ``quick``: the keys-major build's
    cap and stages at the candidate's tiles only."""
    if quick:
        return KEYS_MAJOR_QUICK if km_sweep and kv == "int8" else []
    rows = [
        {"max_splits": s, "block_n": n, "num_warps": w}
        for s, n, w in itertools.product((64, 128, 256), (32, 64), (4, 8))
    ]
    if kv == "int8":
        modes = ({"int8_f16": True}, {"int8_f16": False}, {"int8_grouped": True})
        rows = [{**r, **mode} for r in rows for mode in modes]
        rows += [
            {"max_splits": s, "block_n": 128, "num_warps": 8, **mode}
            for s in (128, 256)
            for mode in modes[::2]
        ]
        rows += _keys_major_sweep((128, 256), (32, 64, 128))
    return rows


def _caches(kv: str, layers: int, num_pages: int) -> list[tuple]:
    shape = (num_pages, PAGE, HKV, HEAD_DIM)
    out = []
    for _ in range(layers):
        if kv == "bf16":
            out.append((torch.randn(shape, device=DEV, dtype=BF16), torch.randn(shape, device=DEV, dtype=BF16),
                        None, None))  # fmt: skip
        else:
            num_scales = HEAD_DIM // kv_int8_group_size(HEAD_DIM)
            codes = [torch.randint(-127, 128, shape, device=DEV, dtype=torch.int8) for _ in "kv"]
            scales = [(torch.rand(*shape[:3], num_scales, device=DEV) * 0.02).half() for _ in "kv"]
            out.append((codes[0], codes[1], scales[0], scales[1]))
    return out


def bench(context: int, batch: int, layers: int, quick: bool, km_sweep: bool = False) -> list[dict]:
    max_pages = -(-context // PAGE)
    table = torch.randperm(batch * max_pages, device=DEV, dtype=torch.int32).view(batch, max_pages)
    lens = torch.full((batch,), context, device=DEV, dtype=torch.int32)
    query = torch.randn(batch, HQ, HEAD_DIM, device=DEV, dtype=BF16)
    scale = HEAD_DIM**-0.5
    rows = []
    for kv in ("bf16", "int8"):
        caches = _caches(kv, layers, batch * max_pages)
        row_bytes = (
            HEAD_DIM * 2 if kv == "bf16" else HEAD_DIM + 2 * (HEAD_DIM // kv_int8_group_size(HEAD_DIM))
        )
        nbytes = 2 * batch * context * HKV * row_bytes  # K and V of one layer
        k0, v0, ks0, vs0 = caches[0]
        expected = paged_attention_decode_ref(query, k0, v0, table, lens, scale, ks0, vs0)
        for label, knobs in [
            ("default", {}),
            ("candidate", _candidate(kv)),
            *([("candidate_f16", _candidate(kv, grouped=False))] if kv == "int8" else []),
            *([("candidate_km", _candidate(kv, keys_major=True))] if kv == "int8" else []),
            *(("sweep", k) for k in _sweep(kv, quick, km_sweep)),
        ]:

            def all_layers(knobs: dict = knobs, caches: list = caches) -> None:
                for kc, vc, ks, vs in caches:
                    paged_attention_decode(query, kc, vc, table, lens, scale, ks, vs, **knobs)

            try:
                err = _err(
                    paged_attention_decode(query, k0, v0, table, lens, scale, ks0, vs0, **knobs), expected
                )
                us = _us(all_layers, graph=True) / layers
            except Exception as exc:  # noqa: BLE001 - a setting that does not compile (registers) is a row too
                row = {"kv": kv, "batch": batch, "context": context, "config": label, **knobs,
                       "error": f"{type(exc).__name__}: {str(exc)[:200]}"}  # fmt: skip
            else:
                row = {"kv": kv, "batch": batch, "context": context, "config": label, **knobs,
                       "us_per_layer": round(us, 2), "GBps": round(nbytes / us / 1e3, 1), **err}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
        del caches, expected
        torch.cuda.empty_cache()
    return rows


def _rows_of(timed: list[dict], kv: str, config: str | None) -> list[dict]:
    """``kv``'s rows of ``config`` (None: all); candidate_f16 and candidate_km differ from the candidate for int8
    only, so bf16's side of them is bf16's candidate."""
    wanted = "candidate" if kv == "bf16" and config in CANDIDATES else config
    return [r for r in timed if r["kv"] == kv and (config is None or r["config"] == wanted)]


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for batch in sorted({r["batch"] for r in rows}):
        timed = [r for r in rows if r["batch"] == batch and "us_per_layer" in r]

        for config in ("default", *CANDIDATES, None):
            have = {kv: _rows_of(timed, kv, config) for kv in ("bf16", "int8")}
            if not all(have.values()):
                continue  # a configuration that failed on one side: its rows say why
            b, i = (min(have[kv], key=lambda r: r["us_per_layer"]) for kv in ("bf16", "int8"))
            out.append({"batch": batch, "config": config or "best of sweep", "bf16_us": b["us_per_layer"],
                        "int8_us": i["us_per_layer"], "int8_over_bf16": round(i["us_per_layer"] / b["us_per_layer"], 3),
                        "bf16_knobs": {k: b[k] for k in OLD if k in b},
                        "int8_knobs": {k: i[k] for k in OLD if k in i}})  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--context", type=int, default=100_000, help="keys per sequence")
    p.add_argument("--batch", default="1,4", help="batch sizes, comma-separated")
    p.add_argument("--layers", type=int, default=16, help="layers' caches per timed replay")
    p.add_argument("--quick", action="store_true", help="the defaults and the candidate defaults only")
    p.add_argument("--km-sweep", action="store_true",
                   help="with --quick: also the keys-major build's register caps and stages")  # fmt: skip
    args = p.parse_args()
    rows = []
    for batch in (int(b) for b in args.batch.split(",")):
        rows += bench(args.context, batch, args.layers, args.quick, args.km_sweep)
    commit = (
        os.environ.get("NINFER_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    )
    result = {"what": "paged_attention_decode bf16 vs int8 KV, Qwen3.6-27B geometry", "date": datetime.date.today()
              .isoformat(), "gpu": torch.cuda.get_device_name(), "commit": commit, "triton": triton.__version__,
              "geometry": {"q_heads": HQ, "kv_heads": HKV, "head_dim": HEAD_DIM, "page_size": PAGE},
              "summary": summarize(rows), "rows": rows}  # fmt: skip
    for line in result["summary"]:
        print(json.dumps(line), flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
