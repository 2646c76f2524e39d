"""CacheConfig / SchedulerConfig / EngineConfig validation and the page count they imply."""

from __future__ import annotations

import pytest

from engine.config import CacheConfig, EngineConfig, SchedulerConfig


@pytest.mark.parametrize(
    ("cls", "field", "value"),
    [
        (SchedulerConfig, "max_concurrency", 0),
        (SchedulerConfig, "max_concurrency", 9),
        (SchedulerConfig, "max_context", 1),
        (SchedulerConfig, "max_context", 262_145),
        (SchedulerConfig, "max_pending_requests", -1),
        (SchedulerConfig, "pending_timeout_ms", 0),
        (SchedulerConfig, "prefill_chunk", 0),
        (SchedulerConfig, "prefill_chunk_decoding", 0),
        (SchedulerConfig, "prefill_chunk_decoding", -128),
        (SchedulerConfig, "prefill_chunk_decoding", 1.5),
        (SchedulerConfig, "prefill_chunk_decoding", "512"),
        (SchedulerConfig, "prefill_chunk_decoding", True),
        (SchedulerConfig, "default_max_tokens", 0),
        (CacheConfig, "page_size", 0),
        (CacheConfig, "kv_dtype", "fp16"),
        (CacheConfig, "kv_capacity", 0),
        (CacheConfig, "kv_capacity", "lots"),
        (CacheConfig, "prefix_reuse", "no"),
        (CacheConfig, "max_checkpoints", -1),
    ],
)
def test_bad_values_raise_value_error_naming_field_and_value(cls: type, field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"^{field}={value!r}"):
        cls(**{field: value})


def test_prefill_chunk_decoding_defaults_to_at_most_2048_and_never_exceeds_prefill_chunk() -> None:
    assert SchedulerConfig().effective_prefill_chunk_decoding == 1024  # min(prefill_chunk 1024, 2048)
    assert SchedulerConfig(prefill_chunk=8192).effective_prefill_chunk_decoding == 2048
    assert SchedulerConfig(prefill_chunk=128).effective_prefill_chunk_decoding == 128
    explicit = SchedulerConfig(prefill_chunk=8192, prefill_chunk_decoding=512, max_concurrency=4)
    assert explicit.effective_prefill_chunk_decoding == 512
    assert explicit.max_num_batched_tokens == 8192 + 4  # the step bound: the budget only ever shrinks
    equal = SchedulerConfig(prefill_chunk=256, prefill_chunk_decoding=256)
    assert equal.effective_prefill_chunk_decoding == 256
    with pytest.raises(ValueError, match=r"^prefill_chunk_decoding=4096: must be <= prefill_chunk \(2048\)"):
        SchedulerConfig(prefill_chunk=2048, prefill_chunk_decoding=4096)
    with pytest.raises(ValueError, match="^prefill_chunk_decoding=0: .*starve"):
        EngineConfig.from_flags(prefill_chunk_decoding=0)
    assert EngineConfig.from_flags(prefill_chunk_decoding=128).scheduler.prefill_chunk_decoding == 128


def test_prefill_budgets_are_multiples_of_prefill_chunk_multiple() -> None:
    with pytest.raises(ValueError, match=r"^prefill_chunk=100: must be a multiple of 128$"):
        SchedulerConfig(prefill_chunk=100)
    with pytest.raises(ValueError, match=r"^prefill_chunk_decoding=64: must be a multiple of 128$"):
        EngineConfig.from_flags(prefill_chunk_decoding=64)
    small = SchedulerConfig(prefill_chunk=16, prefill_chunk_decoding=4, prefill_chunk_multiple=1)
    assert (small.prefill_chunk, small.effective_prefill_chunk_decoding) == (16, 4)
    assert SchedulerConfig(prefill_chunk=96, prefill_chunk_multiple=32).prefill_chunk == 96
    with pytest.raises(ValueError, match=r"^prefill_chunk_multiple=0: must be >= 1$"):
        SchedulerConfig(prefill_chunk_multiple=0)


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        ({"max_context": 4096, "kv_capacity": 1024}, r"^kv_capacity=1024: must be >= max_context \(4096\)$"),
        ({"spec": "eagle"}, r"^spec='eagle': must be one of \('mtp', 'dflash'\) or None$"),
        (
            {"spec": "dflash", "host_kv_cache_mib": 64},
            r"^spec='dflash': cannot run with host_kv_cache_mib=64",
        ),
        ({"spec": "dflash", "draft_tokens": 16}, r"^draft_tokens=16: must be in 1\.\.15 with --spec dflash$"),
        ({"draft_tokens": 2}, r"^draft_tokens=2: needs speculative decoding \(--spec mtp\)$"),
    ],
)
def test_rules_across_groups_are_the_engine_configs(flags: dict[str, object], reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        EngineConfig.from_flags(**flags)


def test_num_pages_follows_kv_capacity() -> None:
    assert CacheConfig().num_pages(8192) == 128  # omitted: one max_context worth of 64-token pages
    assert CacheConfig(kv_capacity=10_000).num_pages(8192) == 157
    assert CacheConfig(kv_capacity="auto").num_pages(8192, auto_pages=500) == 500
    assert CacheConfig(kv_capacity="auto").num_pages(8192, auto_pages=3) == 128
    with pytest.raises(ValueError, match="kv_capacity=4096: must be >= max_context"):
        CacheConfig(kv_capacity=4096).num_pages(8192)
    with pytest.raises(ValueError, match="auto_pages"):
        CacheConfig(kv_capacity="auto").num_pages(8192)


def test_engine_config_from_flags_routes_snake_case_flags() -> None:
    cfg = EngineConfig.from_flags(
        "m.ninfer", max_context=4096, max_concurrency=4, prefix_reuse=False, greedy=True
    )
    assert cfg.scheduler.max_context == 4096 and cfg.scheduler.max_concurrency == 4
    assert cfg.cache.prefix_reuse is False and cfg.greedy and cfg.artifact == "m.ninfer"
    assert cfg.num_pages == 64 and cfg.scheduler.max_num_batched_tokens == 1024 + 4
    with pytest.raises(ValueError, match="^max_contxt=1: unknown engine option"):
        EngineConfig.from_flags(max_contxt=1)
    with pytest.raises(ValueError, match="^max_concurrency=12"):
        EngineConfig.from_flags(max_concurrency=12)
