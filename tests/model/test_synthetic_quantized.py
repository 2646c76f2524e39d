"""Synthetic quantized models (engine/testing/synthetic_quant.py): random payloads of a profile's formats, bound
as a real artifact of that profile is, run a step, and match their own dequantized bf16 twin.

On the CPU the quantized layers run ``kernels.quant``'s exact reference, so the quantized model and its twin
(every quantized weight dequantized into a dense layer) compute the same function: logits agree to fp32
rounding. The payload checks pin what makes the random weights "the real cost": every object has exactly its
stored size and format, and the words are valid (padding lanes zero, W8 never -128, no NaN FP8 words).
"""

from __future__ import annotations

import pytest
import torch

from engine.artifact.profiles import TensorSpec
from engine.model import allocate_model_cache
from engine.model.config import ModelConfig
from engine.model.linear import Linear
from engine.model.quant import QuantEmbedding, QuantMethod
from engine.request import SamplingParams
from engine.runner import ModelRunner
from engine.step import RowPlan, StepPlan
from engine.testing.synthetic import load_synthetic, synthetic_config
from engine.testing.synthetic_quant import (
    build_synthetic_quantized,
    dequantized_twin,
    quantized_bytes,
    random_payload,
    synthetic_profile,
)
from engine.testing.tiny import tiny_hf_config
from kernels.quant import FP8, NVFP4, Q4, Q5, Q6, W8, decode_words, dequantize, payload_bytes, view_planes


@pytest.fixture(scope="module")
def dense_config() -> ModelConfig:
    return synthetic_config("tiny-dense")


@pytest.fixture(scope="module")
def groupwise():
    """What `ninfer-serve --synthetic tiny-dense --weights-id qwen3.6-27b/groupwise-int` serves."""
    model, tokenizer, model_id = load_synthetic(
        "tiny-dense", device="cpu", dtype=torch.float32, weights_id="qwen3.6-27b/groupwise-int"
    )
    assert model_id == "tiny-dense-synthetic" and tokenizer.chat_template is not None
    return model


def _logits(model, config, paged, tokens):
    Driver, Lane = paged
    cache = allocate_model_cache(config, num_pages=2, page_size=64, num_state_slots=1, dtype=torch.float32)
    return model.compute_logits(model(Driver(cache).batch([Lane(slot=0)], [tokens]), cache))


def test_every_object_has_its_profiles_format_and_stored_size(groupwise, dense_config):
    profile = synthetic_profile("qwen3.6-27b/groupwise-int", dense_config)
    specs = [s for s in profile.objects(dense_config) if isinstance(s, TensorSpec) and s.quantized]
    specs = [s for s in specs if not s.name.startswith("mtp/")]  # MTP off, as load_model's default
    assert quantized_bytes(groupwise) == sum(s.bytes for s in specs)
    layers = [m for m in groupwise.modules() if isinstance(m, Linear) and isinstance(m.method, QuantMethod)]
    assert {m.method.format for m in layers} == {Q4, Q5, Q6}
    assert isinstance(groupwise.model.embed_tokens, QuantEmbedding)
    assert groupwise.model.embed_tokens.format == Q6


def test_a_step_matches_the_dequantized_bf16_twin(groupwise, dense_config, paged):
    twin = dequantized_twin(groupwise)
    assert not any(isinstance(m.method, QuantMethod) for m in twin.modules() if isinstance(m, Linear))
    tokens = torch.randint(
        0, dense_config.vocab_size, (24,), generator=torch.Generator().manual_seed(1)
    ).tolist()
    with torch.inference_mode():
        ours, reference = (
            _logits(groupwise, dense_config, paged, tokens),
            _logits(twin, dense_config, paged, tokens),
        )
    assert torch.isfinite(ours).all() and ours.std() > 0
    torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-4)


def test_the_engine_runner_steps_the_quantized_model(groupwise):
    runner = ModelRunner(groupwise, num_pages=4, page_size=64, num_state_slots=2, kv_dtype="bf16",
                         cuda_graph=False, max_context=256)  # fmt: skip
    row = RowPlan(
        request_id="r", lane=0, token_ids=(1, 2, 3, 4), start_pos=0, page_ids=(0, 1), state_slot=0,
        reset_state=True, copy_state_from=None, save_state_to=None, num_sample=1,
        sampling_params=SamplingParams(temperature=0.0), num_output_tokens=0,
    )  # fmt: skip
    with torch.inference_mode():
        result = runner.execute(StepPlan(0, (row,), (), ()))
    assert len(result.sampled_token_ids[0]) == 1


@pytest.mark.parametrize("fmt", [Q4, Q5, Q6, W8])
def test_random_groupwise_payloads_are_valid_words(fmt):
    shape = (6, 130)  # K pads to 256: a partial group and groups wholly past K
    payload = random_payload(fmt, shape, torch.Generator().manual_seed(0), "cpu")
    assert payload.numel() == payload_bytes(fmt, shape)
    qw = view_planes(fmt, payload, shape)
    codes, scales, _ = decode_words(fmt, payload, shape)
    logical = -(-130 // (32 if fmt == W8 else 64))
    assert codes.unique().numel() > 10 and (scales[:, :logical].float() > 0).all()
    assert (scales[:, logical:] == 0).all()  # groups wholly past K
    assert int(codes.min()) >= (-127 if fmt == W8 else -(1 << (int(fmt[1]) - 1)))
    padded = dequantize(qw.__class__(**{**qw.__dict__, "shape": (6, qw.k_pad)}))
    assert (padded[:, 130:] == 0).all()  # padding lanes are code 0
    weight = dequantize(qw)
    assert 0.01 < float(weight.std()) < 0.04


def test_random_nvfp4_and_fp8_payloads_are_valid_words():
    gen = torch.Generator().manual_seed(0)
    for fmt in (NVFP4, FP8):
        payload = random_payload(fmt, (256, 128), gen, "cpu")
        assert payload.numel() == payload_bytes(fmt, (256, 128))
        weight = dequantize(view_planes(fmt, payload, (256, 128)))
        assert torch.isfinite(weight).all() and 0.005 < float(weight.std()) < 0.05, fmt


def test_a_moe_geometry_builds_and_matches_its_twin(paged):
    config = ModelConfig.from_hf(tiny_hf_config("moe"))
    model = build_synthetic_quantized(config, "groupwise-int", device="cpu", dtype=torch.float32)
    assert model.model.embed_tokens.format == W8
    tokens = list(range(100, 120))
    with torch.inference_mode():
        ours, reference = (
            _logits(model, config, paged, tokens),
            _logits(dequantized_twin(model), config, paged, tokens),
        )
    torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-4)


def test_an_unknown_or_mismatched_weights_id_is_refused(dense_config):
    with pytest.raises(ValueError, match="expected one of"):
        synthetic_profile("int3", dense_config)
    with pytest.raises(ValueError, match="MoE profile"):
        synthetic_profile("qwen3.6-35b-a3b/groupwise-int", dense_config)


def test_gdn_a_and_b_load_as_one_gemv(groupwise, dense_config, paged, monkeypatch):
    """The 27B groupwise-int profile stores a GDN layer's BF16 a and b projections apart; loading fuses them into one
    ``a_b_projection`` (rows a then b: one decode GEMV instead of two), and the model computes what the unfused one
    does (rows of one GEMM: the same dot products)."""
    from engine.model import profile_load
    from engine.model.gdn import GatedDeltaNet
    from engine.model.linear import DenseMethod

    layers = [m for m in groupwise.modules() if isinstance(m, GatedDeltaNet)]
    assert layers
    for gdn in layers:
        assert "a_b_projection" in gdn.input_projections
        assert not {"a_projection", "b_projection"} & set(gdn.input_projections)
        assert not hasattr(gdn, "a_projection") and not hasattr(gdn, "b_projection")
        fused = gdn.a_b_projection
        assert isinstance(fused.method, DenseMethod) and [name for name, _ in fused.outputs] == ["a", "b"]
    monkeypatch.setattr(profile_load, "fuse_gdn_gates", lambda model: 0)
    apart, _, _ = load_synthetic(
        "tiny-dense", device="cpu", dtype=torch.float32, weights_id="qwen3.6-27b/groupwise-int"
    )
    assert all("a_projection" in m.input_projections for m in apart.modules() if isinstance(m, GatedDeltaNet))
    tokens = torch.randint(
        0, dense_config.vocab_size, (24,), generator=torch.Generator().manual_seed(2)
    ).tolist()
    with torch.inference_mode():
        ours, theirs = (
            _logits(groupwise, dense_config, paged, tokens),
            _logits(apart, dense_config, paged, tokens),
        )
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
