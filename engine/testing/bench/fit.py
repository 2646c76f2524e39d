"""`ninfer-bench --gpu-memory-limit GiB`: what fits a smaller card (the RTX 5090's 32 GiB) under the engine's cap.

With the cap applied (``engine.core.apply_memory_limit``, as ``ninfer-serve --gpu-memory-limit`` does) after the
weights are built, ``fit_report`` sizes the largest KV pool that still runs, as ``--kv-capacity auto`` sizes it under
the cap (``engine.runner.sizing.measure_auto_pages``): a probe runner with a small pool, 8 lanes' GDN state slots
plus the engine's default prefix checkpoints and CUDA graphs runs one ``--prefill-chunk`` prefill and one decode step
of every lane; what is left under the cap after that, less the headroom, becomes pages. It then proves the pool by
building that runner (graphs captured, as served) and running the same steps; on out-of-memory the pool shrinks
by 5% and it tries again. Reported: the pool's tokens (the longest one context), and per lane count the longest
context every lane can hold at once (pool / lanes, at most the model's ``max_position_embeddings``). The weights
are what the device holds after the build (``memory_reserved``): quantized payloads as stored, plus the one
dense-bank scratch a groupwise-int MoE model's prefill dequantizes its experts into (``expert_scratch_GiB``).
"""

from __future__ import annotations

import gc
from typing import Any

import torch

from engine.config import MAX_CONCURRENCY_LIMIT, CacheConfig, KVDtype
from engine.model.quant_experts import scratch_bytes
from engine.model.qwen3_5 import Qwen3_5ForCausalLM
from engine.runner import ModelRunner
from engine.runner.sizing import measure_auto_pages
from engine.testing.bench.steps import (
    PAGE_SIZE,
    kv_bytes_per_token,
    lane_state_bytes,
    make_runner,
    run_decode,
    run_prefill,
)

MAX_TRIES = 8


def fit_report(
    model: Qwen3_5ForCausalLM, limit_bytes: int, kv_dtype: KVDtype, prefill_chunk: int, log: Any = print
) -> dict[str, Any]:
    config = model.config
    lanes = MAX_CONCURRENCY_LIMIT
    slots = lanes + CacheConfig().max_checkpoints
    per_token = kv_bytes_per_token(config, kv_dtype)
    page_bytes = int(per_token * PAGE_SIZE)
    gc.collect()
    torch.cuda.empty_cache()  # the weights' build temporaries are not the weights
    weights = torch.cuda.memory_reserved()
    report: dict[str, Any] = {
        "limit_GiB": round(limit_bytes / 1024**3, 2),
        "weights_reserved_GiB": round(weights / 1024**3, 3),  # the quantized experts' shared scratch included
        "expert_scratch_GiB": round(scratch_bytes(model) / 1024**3, 3),
        "kv_dtype": kv_dtype,
        "kv_bytes_per_token": per_token,
        "state_slots": slots,
        "state_bytes_per_slot": lane_state_bytes(config),
        "proved": False,
    }

    def build(num_pages: int) -> ModelRunner:
        return make_runner(model, num_pages, slots, kv_dtype, True, num_pages * PAGE_SIZE)

    def exercise(runner: ModelRunner) -> None:  # a prefill chunk, then one decode step of every lane
        chunk = min(prefill_chunk, (runner.cache.num_pages - 1) * PAGE_SIZE)
        run_prefill(runner, config.vocab_size, chunk, chunk)
        run_decode(runner, config.vocab_size, lanes, 0, 1, 1)

    probe_pages = max(lanes, -(-prefill_chunk // PAGE_SIZE)) + 1
    pages = measure_auto_pages(build, exercise, min_pages=probe_pages, page_bytes=page_bytes,
                               device=torch.device("cuda", torch.cuda.current_device()), memory_limit=limit_bytes)  # fmt: skip
    report["measured_pages"] = pages
    runner: ModelRunner | None = None
    for attempt in range(MAX_TRIES):
        report["attempts"] = attempt + 1
        try:
            runner = build(pages)
            exercise(runner)
            report["proved"] = True
            report["peak_reserved_GiB"] = round(torch.cuda.max_memory_reserved() / 1024**3, 3)
            break
        except torch.OutOfMemoryError:
            log(
                f"fit: {pages} pages ({pages * PAGE_SIZE} tokens) ran out of memory under the cap; trying 5% fewer"
            )
            pages = int(pages * 0.95)
        finally:
            runner = None
            gc.collect()
            torch.cuda.empty_cache()
    tokens = pages * PAGE_SIZE
    longest = config.max_position_embeddings
    report["pool_tokens"] = tokens
    report["max_context"] = min(tokens, longest)
    report["per_lanes"] = [
        {"lanes": n, "max_context_each": min(tokens // n // PAGE_SIZE * PAGE_SIZE, longest)}
        for n in range(1, lanes + 1)
    ]
    return report
