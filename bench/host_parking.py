"""Host-RAM KV parking at the Qwen3.6-27B cache geometry: park/restore bandwidth vs raw pinned copies.

Run on a CUDA machine from the repository root:

    python3 bench/host_parking.py --pages 3200 --json bench/results/host_parking_h200_DATE.json

It allocates the real 27B KV/state geometry (16 attention layers 4x256 + MTP KV, 48 GDN layers 48x128x128 fp32),
fills it with random data, measures one 512 MiB pinned copy each way as the hardware reference, then parks and
restores one session of `--pages` pages (3200 = 204,800 tokens) with contiguous and with scattered page ids,
checking the restored bytes. Results: GB/s each way, fraction of the raw pinned bandwidth, restore seconds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from engine.cache.host import HostIndex
from engine.cache.host_blocks import HostBudget
from engine.model import allocate_model_cache
from engine.model.config import ModelConfig
from engine.runner.host_copier import HostCopier
from engine.runner.host_layout import cache_geometry


def geometry_27b() -> ModelConfig:
    layer_types = tuple("full_attention" if i % 4 == 3 else "linear_attention" for i in range(64))
    return ModelConfig(
        model_type="qwen3_5_text", vocab_size=1000, hidden_size=5120, num_hidden_layers=64,
        layer_types=layer_types, num_attention_heads=24, num_key_value_heads=4, head_dim=256,
        rms_norm_eps=1e-6, rope_theta=1e7, partial_rotary_factor=0.25, mrope_section=None,
        linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_num_key_heads=16, linear_num_value_heads=48, intermediate_size=17408,
    )  # fmt: skip


def raw_pinned_gbps(num_bytes: int) -> dict[str, float]:
    dev = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    host = torch.empty(num_bytes, dtype=torch.uint8, pin_memory=True)
    for _ in range(3):
        host.copy_(dev, non_blocking=True)
        dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    out = {}
    for name, copy in (("d2h", lambda: host.copy_(dev, non_blocking=True)), ("h2d", lambda: dev.copy_(host, non_blocking=True))):  # fmt: skip
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        copy()
        end.record()
        end.synchronize()
        out[name] = num_bytes / (start.elapsed_time(end) / 1e3) / 1e9
    return out


def measure(pages: int, host_mib: int) -> dict[str, Any]:
    config = geometry_27b()
    cache = allocate_model_cache(config, num_pages=pages + 64, page_size=64, num_state_slots=3, with_mtp=True, device="cuda")  # fmt: skip
    for t in (*cache.key_cache, *cache.value_cache, *cache.recurrent_state):
        t.normal_()
    geometry = cache_geometry(cache)
    raw = raw_pinned_gbps(512 << 20)
    started = time.perf_counter()
    index = HostIndex(geometry, HostBudget.from_mib(host_mib))  # the scheduler's side: blocks, entries
    copier = HostCopier(geometry, index.budget, device="cuda")  # the runner's side: slabs, copies
    copier.slabs.allocate_all()
    pin_seconds = time.perf_counter() - started
    tokens = list(range(pages * 64))
    runs = []
    for label in ("contiguous", "scattered"):
        rng = random.Random(0)  # src and dst draw different pages: a restore lands anywhere in the pool
        src = list(range(pages)) if label == "contiguous" else rng.sample(range(pages + 64), pages)
        dst = list(range(pages)) if label == "contiguous" else rng.sample(range(pages + 64), pages)
        for rep in range(2):
            # What must come back: every parked page of two attention layers and the checkpoint's GDN state.
            expected = (cache.key_cache[0][src].clone(), cache.value_cache[-1][src].clone(),
                        cache.recurrent_state[0][0].clone())  # fmt: skip
            torch.cuda.synchronize()
            entry = index.add(label, page_ids=src, token_ids=tokens, checkpoints=[(len(tokens), 0)])
            assert entry is not None, "park refused: raise --host-mib"
            park = copier.park(
                cache, block_ids=entry.block_ids, page_ids=src[: entry.num_pages], state_slots=[0]
            )
            park.synchronize()
            for t in (cache.key_cache[0], cache.value_cache[-1], cache.recurrent_state[0][1]):
                t.zero_()
            _, checkpoint, num_pages = index.plan_unpark(label, None, len(dst))
            restore = copier.unpark(cache, block_ids=entry.block_ids, entry_num_pages=entry.num_pages,
                                    checkpoint_index=checkpoint, page_ids=dst[:num_pages], state_slot=1)  # fmt: skip
            restore.synchronize()
            index.finish_unpark(label, keep=False, num_bytes=restore.num_bytes)
            got = (cache.key_cache[0][dst], cache.value_cache[-1][dst], cache.recurrent_state[0][1])
            assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True)), "restored bytes differ"
            del expected, got
            runs.append({
                "pages": label, "rep": rep, "entry_bytes": park.num_bytes,
                "park_seconds": park.seconds, "park_gbps": park.num_bytes / park.seconds / 1e9,
                "restore_seconds": restore.seconds, "restore_gbps": restore.num_bytes / restore.seconds / 1e9,
                "park_copies": park.num_copies, "restore_copies": restore.num_copies,
            })  # fmt: skip
            print(json.dumps(runs[-1]), flush=True)
    index.check_integrity()
    return {"raw_pinned_gbps_512mib": raw, "pin_seconds": pin_seconds, "host_mib": host_mib, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pages", type=int, default=3200, help="64-token pages in the session (3200 = 204,800 tokens)"
    )
    parser.add_argument("--host-mib", type=int, default=16 * 1024)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = {
        "benchmark": "host_parking_27b_geometry",
        "date": datetime.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name(),
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False).stdout.strip(),
        "command": "python3 bench/host_parking.py " + f"--pages {args.pages} --host-mib {args.host_mib}",
        "tokens": args.pages * 64,
        **measure(args.pages, args.host_mib),
    }  # fmt: skip
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
