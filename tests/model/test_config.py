"""ModelConfig.from_hf: text and composite configs, derived values, and errors that name the field."""

from __future__ import annotations

import pytest

from engine.model import ModelConfig

DENSE_TEXT = {
    "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 5120, "intermediate_size": 17408,
    "num_hidden_layers": 64, "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256,
    "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6, "full_attention_interval": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                        "mrope_section": [11, 11, 10], "mrope_interleaved": True},
    "mtp_num_hidden_layers": 1, "eos_token_id": 248044, "dtype": "bfloat16",
}  # fmt: skip
MOE_TEXT = {
    **{k: v for k, v in DENSE_TEXT.items() if k != "intermediate_size"},
    "model_type": "qwen3_5_moe_text", "hidden_size": 2048, "num_hidden_layers": 40, "num_attention_heads": 16,
    "num_key_value_heads": 2, "linear_num_value_heads": 32, "num_experts": 256, "num_experts_per_tok": 8,
    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
}  # fmt: skip


def test_27b_composite_config_normalises_text_tower():
    c = ModelConfig.from_hf({"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
                             "text_config": {k: v for k, v in DENSE_TEXT.items() if k != "model_type"},
                             "vision_config": {"depth": 27}, "tie_word_embeddings": False})  # fmt: skip
    assert c.model_type == "qwen3_5_text" and not c.is_moe and c.architecture == "Qwen3_5ForCausalLM"
    assert c.attention_layer_ids == tuple(range(3, 64, 4)) and c.num_linear_layers == 48
    assert c.rotary_dim == 64 and c.mrope_section == (11, 11, 10) and c.rope_theta == 1e7
    assert c.conv_dim == 10240 and c.eos_token_ids == (248044,) and c.dtype == "bfloat16"


def test_35b_moe_text_config():
    c = ModelConfig.from_hf(MOE_TEXT)
    assert c.is_moe and c.architecture == "Qwen3_5MoeForCausalLM"
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (256, 8, 512)
    assert c.intermediate_size is None and c.conv_dim == 8192 and c.num_attention_layers == 10


def test_composite_moe_checks_text_model_type():
    ok = ModelConfig.from_hf({"model_type": "qwen3_5_moe", "text_config": MOE_TEXT})
    assert ok.is_moe
    with pytest.raises(ValueError, match="text_config.model_type"):
        ModelConfig.from_hf({"model_type": "qwen3_5_moe", "text_config": DENSE_TEXT})


def test_legacy_top_level_rope_fields_and_missing_mtp_default():
    legacy = {k: v for k, v in DENSE_TEXT.items() if k not in ("rope_parameters", "mtp_num_hidden_layers")}
    c = ModelConfig.from_hf({**legacy, "rope_theta": 5e6, "partial_rotary_factor": 0.5})
    assert c.rope_theta == 5e6 and c.rotary_dim == 128 and c.mrope_section is None
    assert c.mtp_num_hidden_layers == 1


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"model_type": "llama"}, "model_type"),
        ({"num_hidden_layers": None}, "num_hidden_layers"),
        ({"intermediate_size": None}, "intermediate_size"),
        ({"num_key_value_heads": 5}, "num_key_value_heads"),
        ({"linear_num_value_heads": 40, "linear_num_key_heads": 16}, "linear_num_value_heads"),
        ({"layer_types": ["full_attention"] * 3}, "layer_types"),
        ({"layer_types": ["sliding_attention"] * 64}, "layer_types"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_type"),
        ({"attention_bias": True}, "attention_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"hidden_size": -1}, "hidden_size"),
    ],
)
def test_bad_fields_raise_value_error_naming_them(change, field):
    with pytest.raises(ValueError, match=field):
        ModelConfig.from_hf({**DENSE_TEXT, **change})


def test_moe_needs_expert_fields():
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        ModelConfig.from_hf({k: v for k, v in MOE_TEXT.items() if k != "num_experts_per_tok"})
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        ModelConfig.from_hf({**MOE_TEXT, "num_experts_per_tok": 300})


def test_config_is_frozen():
    c = ModelConfig.from_hf(DENSE_TEXT)
    with pytest.raises(AttributeError):
        c.hidden_size = 1  # type: ignore[misc]
