"""`ninfer-bench --vs-hf` on the CPU: HF transformers' model built from our ModelConfig has our geometry, and
`time_hf` times it (prefill per length, decode per concurrency, lengths over the cap reported as skipped).

engine.testing.bench imports nothing CUDA-only at import time; only its HF part and argument parser are used here."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from engine.model.config import ModelConfig
from engine.model.qwen3_5 import Qwen3_5ForCausalLM
from engine.testing.bench import add_speedups, build_hf_model, parse_args, time_hf
from engine.testing.synthetic import GEOMETRIES

# not the 3:1 default pattern, so the HF model must have taken our layer_types as they are
_LAYERS = ("linear_attention", "full_attention", "linear_attention", "linear_attention")
DENSE = ModelConfig(
    model_type="qwen3_5_text", vocab_size=320, hidden_size=48, num_hidden_layers=4, layer_types=_LAYERS,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=1e7,
    partial_rotary_factor=0.5, mrope_section=(2, 1, 1), linear_conv_kernel_dim=4, linear_key_head_dim=8,
    linear_value_head_dim=12, linear_num_key_heads=2, linear_num_value_heads=6, intermediate_size=80,
)  # fmt: skip
MOE = dataclasses.replace(
    DENSE, model_type="qwen3_5_moe_text", intermediate_size=None, num_experts=6, num_experts_per_tok=2,
    moe_intermediate_size=24, shared_expert_intermediate_size=32, tie_word_embeddings=True,
)  # fmt: skip


@pytest.fixture(autouse=True)
def _one_thread():
    """The tiny matmuls gain nothing from threads, and on a busy 2-core machine spinning threads make them
    ~20x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("config", [DENSE, MOE], ids=["dense", "moe"])
def test_hf_model_has_our_geometry(config: ModelConfig) -> None:
    model = build_hf_model(config, device="cpu")
    assert type(model).__name__ == config.architecture
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert model.model.embed_tokens.num_embeddings == config.vocab_size
    assert model.lm_head.out_features == config.vocab_size
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == config.tie_word_embeddings
    assert model.model.rotary_emb.inv_freq.numel() * 2 == config.rotary_dim
    layers = model.model.layers
    assert len(layers) == config.num_hidden_layers
    for layer, kind in zip(layers, config.layer_types, strict=True):
        assert hasattr(layer, "linear_attn") == (kind == "linear_attention")
        assert hasattr(layer, "self_attn") == (kind == "full_attention")
        if kind == "full_attention":
            attn = layer.self_attn
            # the query projection carries the output gate too: 2 x heads x head_dim
            assert attn.q_proj.out_features == 2 * config.num_attention_heads * config.head_dim
            assert attn.k_proj.out_features == config.num_key_value_heads * config.head_dim
            assert attn.v_proj.out_features == config.num_key_value_heads * config.head_dim
            assert attn.o_proj.in_features == config.num_attention_heads * config.head_dim
        else:
            gdn = layer.linear_attn
            assert (gdn.num_k_heads, gdn.num_v_heads) == (
                config.linear_num_key_heads,
                config.linear_num_value_heads,
            )
            assert (gdn.head_k_dim, gdn.head_v_dim) == (
                config.linear_key_head_dim,
                config.linear_value_head_dim,
            )
            assert gdn.conv1d.weight.shape == (config.conv_dim, 1, config.linear_conv_kernel_dim)
        if config.is_moe:
            experts = layer.mlp.experts
            assert experts.gate_up_proj.shape[0] == config.num_experts
            assert experts.down_proj.shape[-1] == config.moe_intermediate_size
            assert layer.mlp.gate.top_k == config.num_experts_per_tok
            assert layer.mlp.shared_expert.down_proj.in_features == config.shared_expert_intermediate_size
        else:
            assert layer.mlp.down_proj.in_features == config.intermediate_size
    assert _num_params(model) == _num_params(_ours_on_meta(config))
    # and the config HF built reads back as ours
    back = ModelConfig.from_hf(model.config.to_dict())
    assert back.dtype == "bfloat16"
    assert dataclasses.replace(back, mtp_num_hidden_layers=config.mtp_num_hidden_layers, dtype=None) == config


def _num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for name, p in model.named_parameters() if not name.startswith("mtp"))


def _ours_on_meta(config: ModelConfig) -> torch.nn.Module:
    with torch.device("meta"):
        return Qwen3_5ForCausalLM(config)


@pytest.mark.parametrize("name", sorted(GEOMETRIES))
def test_hf_model_of_the_real_widths(name: str) -> None:
    """The real geometries' widths (4 of their layers, on the meta device: nothing allocated): HF's model
    holds exactly our parameter count."""
    real = GEOMETRIES[name]
    config = dataclasses.replace(real, num_hidden_layers=4, layer_types=real.layer_types[:4])
    model = build_hf_model(config, device="meta")
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert _num_params(model) == _num_params(_ours_on_meta(config))


@pytest.mark.parametrize("config", [DENSE, MOE], ids=["dense", "moe"])
def test_time_hf_rows(config: ModelConfig) -> None:
    logged: list[str] = []
    hf = time_hf(config, prompt_lens=[6, 300, 11], max_prompt_len=16, prefill_runs=2, concurrency=[1, 2],
                 decode_context=5, decode_tokens=2, decode_warmup=1, device="cpu", log=logged.append)  # fmt: skip
    assert hf["transformers"] == transformers.__version__
    assert hf["model_class"] == config.architecture and hf["dtype"] == "bfloat16"
    assert hf["cache"] == "DynamicCache" and "argmax" in hf["decode_method"]
    assert isinstance(hf["weights_GB"], float) and hf["build_s"] >= 0 and hf["attn_implementation"]
    assert (hf["experts_implementation"] is not None) == config.is_moe
    assert set(hf["kernels"]) == {"chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule",
                                  "causal_conv1d_fn", "causal_conv1d_update"}  # fmt: skip
    assert [row["prompt_len"] for row in hf["prefill"]] == [6, 300, 11]
    for row in hf["prefill"][::2]:
        assert row.keys() == {"prompt_len", "seconds", "tok_s", "runs_s"}
        assert row["tok_s"] > 0 and row["seconds"] > 0 and len(row["runs_s"]) == 2
        assert row["tok_s"] == pytest.approx(row["prompt_len"] / row["seconds"], rel=0.01)
    skipped = hf["prefill"][1]
    assert skipped.keys() == {"prompt_len", "skipped"} and "--hf-max-prompt-len 16" in skipped["skipped"]
    assert [row["concurrency"] for row in hf["decode"]] == [1, 2]
    for row in hf["decode"]:
        assert row.keys() == {"concurrency", "context", "steps", "step_ms", "tok_s"}
        assert (row["context"], row["steps"]) == (5, 2)
        assert row["step_ms"] > 0
        assert row["tok_s"] == pytest.approx(row["concurrency"] * 1e3 / row["step_ms"], rel=0.01)
    assert sum(msg.startswith("hf prefill") for msg in logged) == 3
    assert sum(msg.startswith("hf decode") for msg in logged) == 2


def test_add_speedups_is_ours_over_hf_where_both_exist() -> None:
    hf = {
        "prefill": [{"prompt_len": 100, "tok_s": 50.0}, {"prompt_len": 200, "tok_s": 40.0},
                    {"prompt_len": 9999, "skipped": "too long"}],
        "decode": [{"concurrency": 1, "tok_s": 10.0}, {"concurrency": 2, "tok_s": 16.0},
                   {"concurrency": 4, "skipped": "out of memory"}],
    }  # fmt: skip
    prefill = [{"prompt_len": 100, "tok_s": 200.0}, {"prompt_len": 9999, "tok_s": 1.0}]
    decode = [{"concurrency": 1, "cuda_graph": True, "tok_s": 60.0}, {"concurrency": 2, "cuda_graph": True, "tok_s": 100.0},
              {"concurrency": 1, "cuda_graph": False, "tok_s": 20.0}]  # fmt: skip
    add_speedups(hf, prefill, decode)
    assert hf["prefill"][0] == {"prompt_len": 100, "tok_s": 50.0, "ours_tok_s": 200.0, "speedup": 4.0}
    assert "speedup" not in hf["prefill"][1] and "speedup" not in hf["prefill"][2]
    assert hf["decode"][0] == {"concurrency": 1, "tok_s": 10.0, "ours_tok_s": 60.0, "speedup": 6.0,
                               "ours_eager_tok_s": 20.0, "speedup_eager": 2.0}  # fmt: skip
    assert hf["decode"][1] == {"concurrency": 2, "tok_s": 16.0, "ours_tok_s": 100.0, "speedup": 6.25}
    assert hf["decode"][2] == {"concurrency": 4, "skipped": "out of memory"}


def test_vs_hf_flags() -> None:
    args = parse_args(["--synthetic", "qwen3.6-27b"])
    assert not args.vs_hf and args.hf_max_prompt_len == 16384 and args.hf_concurrency is None
    args = parse_args(
        ["--synthetic", "qwen3.6-27b", "--vs-hf", "--hf-max-prompt-len", "8192", "--hf-concurrency", "1,8"]
    )
    assert args.vs_hf and args.hf_max_prompt_len == 8192 and args.hf_concurrency == [1, 8]
