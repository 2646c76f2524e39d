"""Startup warm-up (`ModelRunner.warm_up`, `EngineConfig.warmup`, `--no-warmup`): it runs the first-use step
shapes and leaves nothing behind. On the CPU nothing compiles, so what is tested here is that warm-up is
harmless — the same greedy tokens, every page free, counters untouched; the compile time it saves on the GPU
is measured by the device runs (bench/results/load_h200_2026-12-02/README.md)."""

from __future__ import annotations

import pytest
from engine_harness import GREEDY, make_core, prompt, run

from api.serve import parse_args
from engine.config import EngineConfig

PROMPTS = [prompt(n, seed) for seed, n in enumerate((7, 40, 3, 66))]


@pytest.mark.parametrize("arch", ["dense", "moe"])
@pytest.mark.parametrize("kv_dtype", ["bf16", "int8"])
def test_warm_engine_gives_the_cold_engine_tokens_and_leaves_no_trace(arch: str, kv_dtype: str) -> None:
    cold = make_core(arch, max_concurrency=4, kv_dtype=kv_dtype, warmup=False)
    warm = make_core(arch, max_concurrency=4, kv_dtype=kv_dtype, warmup=True, prefill_chunk=96)
    assert cold.warmup is None
    report = warm.warmup
    assert report is not None and report.steps == 4
    assert report.tokens == 96 + 37 + 3 + 1 + 5 + 1 + 1  # chunk; continue + cold 3; decode + 5; two decodes
    assert warm.runner.num_steps == 0 and warm.runner.num_graph_steps == 0
    stats = warm.stats()
    assert stats.num_pages_used == 0 and stats.num_running == 0 and stats.num_prefill_tokens == 0
    warm.check_integrity()
    tokens_warm, _ = run(warm, PROMPTS, GREEDY)
    tokens_cold, _ = run(cold, PROMPTS, GREEDY)
    assert tokens_warm == tokens_cold
    assert all(len(t) == GREEDY.max_tokens for t in tokens_warm)


def test_warmup_fits_a_pool_smaller_than_the_prefill_chunk() -> None:
    core = make_core("dense", max_context=256, kv_capacity=256, prefill_chunk=4096, warmup=True)
    report = core.warmup
    assert report is not None and report.steps == 4
    # 4 pages of 64: the first chunk is cut so that both sequences fit (3 pages for a, 1 for b).
    assert report.tokens == (3 * 64 - 39) + 37 + 3 + 1 + 5 + 1 + 1
    assert run(core, PROMPTS[:2], GREEDY)[0][0]


def test_warmup_defaults_to_gpu_only_and_the_flag_turns_it_off() -> None:
    assert EngineConfig().warmup is None
    assert make_core("dense").warmup is None  # auto: the CPU has nothing to compile
    assert parse_args([])[1].warmup is None
    assert parse_args(["--no-warmup"])[1].warmup is False
    with pytest.raises(ValueError, match="warmup"):
        EngineConfig(warmup="yes")  # type: ignore[arg-type]
