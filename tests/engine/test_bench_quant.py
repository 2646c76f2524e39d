"""`ninfer-bench --weights-id` / `--gpu-memory-limit`: the accounting a quantized synthetic model is measured
against (bytes a step reads, FLOPs a token runs, KV bytes a token takes), checked on the CPU; the timed runs
themselves need the GPU."""

from __future__ import annotations

import pytest
import torch

from engine.testing.bench.cli import main
from engine.testing.bench.steps import kv_bytes_per_token, prefill_flops_per_token, weight_bytes
from engine.testing.synthetic import build_synthetic, synthetic_config
from engine.testing.synthetic_quant import build_synthetic_quantized, quantized_bytes
from kernels.quant import Q6, payload_bytes


@pytest.fixture(scope="module")
def config():
    return synthetic_config("tiny-dense")


def test_a_quantized_model_counts_its_payloads_and_the_same_flops_as_bf16(config):
    quant = build_synthetic_quantized(config, "groupwise-int", device="cpu", dtype=torch.bfloat16)
    dense = build_synthetic(config, device="cpu", dtype=torch.bfloat16)
    q, d = weight_bytes(quant), weight_bytes(dense)
    stored = quantized_bytes(quant) + sum(p.numel() * p.element_size() for p in quant.parameters())
    assert q["dense"] + q["embedding"] == stored
    assert q["embedding"] == payload_bytes(Q6, (config.vocab_size, config.hidden_size))
    assert q["params_dense"] == d["params_dense"]
    assert prefill_flops_per_token(config, q, 512) == prefill_flops_per_token(config, d, 512)


def test_int8_kv_takes_about_half_the_bytes_of_bf16(config):
    bf16, int8 = kv_bytes_per_token(config, "bf16"), kv_bytes_per_token(config, "int8")
    assert bf16 == config.num_attention_layers * 2 * config.num_key_value_heads * config.head_dim * 2
    assert bf16 / 2 < int8 < bf16 * 0.6


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--weights-id", "int3"], "--weights-id 'int3': expected one of"),
        (["--weights-id", "qwen3.6-35b-a3b/groupwise-int"], "a MoE profile"),
        (["--gpu-memory-limit", "0"], "gpu_memory_limit=0.0: must be a positive number"),
    ],
)
def test_bad_options_exit_2_with_the_reason_before_touching_a_device(argv, words, capsys):
    assert main(["--synthetic", "qwen3.6-27b", *argv]) == 2
    assert words in capsys.readouterr().err
