"""ModelRunner pieces: int8 KV (quantiser, and logits within a stated tolerance of the model-dtype KV),
the KV pool size for `--kv-capacity`, and the sampler state it keeps per request."""

from __future__ import annotations

import pytest
import torch
from engine_harness import make_core, one_thread, prompt, run, tiny_loaded

from engine.cache.kv import CPU_AUTO_KV_BYTES, resolve_num_pages
from engine.config import CacheConfig
from engine.model import allocate_model_cache, make_forward_batch
from engine.model.forward import kv_spec
from engine.request import SamplingParams
from kernels.attention import dequantize_kv_int8_ref, kv_int8_group_size, quantize_kv_int8_ref

# int8 KV tolerance, stated: teacher-forced logits within 3% of the largest logit (max abs error),
# and the greedy token (argmax) the same at no fewer than 90% of positions.
INT8_MAX_REL_ERROR = 3e-2
INT8_MIN_ARGMAX_AGREEMENT = 0.9


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


def test_int8_quantiser_error_is_at_most_half_a_step_per_group():
    x = torch.randn(37, 3, 256, generator=torch.Generator().manual_seed(0)) * 4
    x[5, 1, 64:128] = 0.0  # an all-zero group stays exactly zero
    codes, scales = quantize_kv_int8_ref(x, 256 // kv_int8_group_size(256))
    assert codes.dtype == torch.int8 and scales.dtype == torch.float16 and scales.shape == (37, 3, 4)
    back = dequantize_kv_int8_ref(codes, scales)
    step = scales.float().repeat_interleave(64, dim=-1)
    assert bool(((back - x).abs() <= step * 0.5 + 1e-6).all())
    assert bool((back[5, 1, 64:128] == 0).all())
    assert kv_int8_group_size(32) == 32
    with pytest.raises(ValueError, match="head_dim=96"):
        kv_int8_group_size(96)


@pytest.mark.parametrize("arch", ["dense", "moe"])
def test_int8_kv_logits_within_tolerance_of_model_dtype_kv(arch):
    model = tiny_loaded(arch).model
    tokens = prompt(120, 5)
    logits = {}
    for kv_dtype in ("bf16", "int8"):
        cache = allocate_model_cache(model.config, 4, 64, 1, dtype=torch.float32, kv_dtype=kv_dtype)
        rows, start = [], 0
        with torch.inference_mode():
            for size in [50, 40, *[1] * 30]:  # two prefill chunks, then 30 single-token steps
                chunk = tokens[start : start + size]
                batch = make_forward_batch([chunk], [start], [[0, 1, 2, 3]], [0], page_size=64)
                rows.append(model.compute_logits(model(batch, cache)))
                start += size
        logits[kv_dtype] = torch.cat(rows)
    reference, quantised = logits["bf16"], logits["int8"]
    rel = ((quantised - reference).abs().max() / reference.abs().max()).item()
    agreement = (quantised.argmax(-1) == reference.argmax(-1)).float().mean().item()
    assert 0 < rel < INT8_MAX_REL_ERROR, f"max relative logit error {rel:.2e}"
    assert agreement >= INT8_MIN_ARGMAX_AGREEMENT, f"argmax agreement {agreement:.2%}"


def test_int8_engine_runs_and_keeps_page_accounting():
    core = make_core("dense", kv_dtype="int8", max_concurrency=2, page_size=16)
    assert core.runner.cache.key_cache[0].dtype == torch.int8
    tokens, finish = run(core, [prompt(40, 1), prompt(25, 2)])
    assert [len(t) for t in tokens] == [6, 6]
    assert {e.reason.kind.value for e in finish.values()} == {"length"}


def test_kv_capacity_resolution():
    config = tiny_loaded("dense").model.config
    per_page = kv_spec(config, torch.float32, "bf16").page_bytes(64)
    # 2 attention layers x (K + V) x 64 tokens x 2 heads x 32 dims x 4 bytes
    assert per_page == 2 * 2 * 64 * 2 * 32 * 4
    int8_page = kv_spec(config, torch.float32, "int8").page_bytes(64)
    assert int8_page == 2 * 2 * (64 * 2 * 32 + 64 * 2 * 1 * 2)
    for kv_dtype, want in (("bf16", per_page), ("int8", int8_page)):  # the formula is what is allocated
        cache = allocate_model_cache(config, 3, 64, 1, dtype=torch.float32, kv_dtype=kv_dtype)  # type: ignore[arg-type]
        tensors = [*cache.key_cache, *cache.value_cache, *(cache.key_scale or []), *(cache.value_scale or [])]
        assert sum(t.numel() * t.element_size() for t in tensors) == 3 * want

    def pages(**kw: object) -> int:
        cache_config = CacheConfig(**kw)  # type: ignore[arg-type]
        spec = kv_spec(config, torch.float32, cache_config.kv_dtype)
        return resolve_num_pages(cache_config, 1000, spec)

    assert pages() == 16  # omitted: one max_context worth (ceil(1000 / 64))
    assert pages(kv_capacity=4096) == 64
    assert pages(kv_capacity="auto") == CPU_AUTO_KV_BYTES // per_page
    assert pages(kv_capacity="auto", kv_dtype="int8") == CPU_AUTO_KV_BYTES // int8_page
    with pytest.raises(ValueError, match="kv_capacity"):
        pages(kv_capacity=500)


def test_runner_feeds_output_counts_to_penalties_and_drops_request_state_at_finish():
    core = make_core("dense", max_concurrency=2)
    plain = SamplingParams(temperature=0.0, max_tokens=20)
    # Negative penalties reward tokens already generated: greedy decoding then repeats itself.
    rewarded = SamplingParams(temperature=0.0, max_tokens=20, presence_penalty=-2.0, frequency_penalty=-2.0)
    (free,), _ = run(core, [prompt(10, 1)], plain)
    (repeating,), _ = run(core, [prompt(10, 1)], rewarded)
    assert len(set(free)) == 20 and len(set(repeating)) <= 3
    assert repeating[0] == free[0]  # no output yet, so no penalty on the first token
    seeded = SamplingParams(temperature=1.0, seed=3, max_tokens=8)
    (tokens,), _ = run(core, [prompt(10, 2)], seeded)
    assert core.runner.sampler._generators == {} and core.runner._output_token_ids == {}
    (again,), _ = run(core, [prompt(10, 2)], seeded)
    assert again == tokens  # a fresh generator from the same seed: the same draw


def test_a_row_can_sample_several_positions_and_each_gets_its_own_token():
    """`RowPlan.num_sample = n`: the last n fed positions give logits and a token each (the shape of a
    verify step); greedy, they are the argmax of the teacher-forced logits at those positions."""
    from engine.runner import ModelRunner
    from engine.step import RowPlan, StepPlan

    model = tiny_loaded("dense").model
    tokens = prompt(12, 7)
    runner = ModelRunner(model, num_pages=2, page_size=64, num_state_slots=1, cuda_graph=False)
    row = RowPlan(
        request_id="v", lane=0, token_ids=tuple(tokens), start_pos=0, page_ids=(0, 1), state_slot=0,
        reset_state=True, copy_state_from=None, save_state_to=None, num_sample=3,
        sampling_params=SamplingParams(temperature=0.0), num_output_tokens=0,
    )  # fmt: skip
    result = runner.execute(StepPlan(1, (row,), (), ()))
    cache = allocate_model_cache(model.config, 2, 64, 1, dtype=torch.float32)
    with torch.inference_mode():
        batch = make_forward_batch([tokens], [0], [[0, 1]], [0], page_size=64)
        want = model.compute_logits(model(batch, cache))[-3:].argmax(-1).tolist()
    assert result.sampled_token_ids == (tuple(want),) and len(want) == 3
    assert (result.num_accepted, result.num_rolled_back, result.logprobs) == ((0,), (0,), None)
