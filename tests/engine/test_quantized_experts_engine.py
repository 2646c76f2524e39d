"""The engine on a groupwise-int MoE model whose routed experts stay quantized (engine/model/quant_experts.py),
on the CPU: greedy tokens equal its dequantized twin's, with prefix reuse and with MTP speculation.

The model: the tiny MoE geometry (engine.testing.tiny, the real tokenizer) in the 35B-A3B groupwise-int profile,
random payloads (engine.testing.synthetic_quant), MTP head included (its MoE layer's experts quantized too, sharing
the scratch); every other layer dense in both models, so the routed experts are the only difference. Prompts of 20 tokens prefill through the few-token path, of 90 through the scratch path; a
second turn extends a first one, so it reuses the first turn's checkpoint.
"""

from __future__ import annotations

import functools

import torch
from engine_harness import one_thread, prompt, run, tiny_loaded

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.model.config import ModelConfig
from engine.model.mlp import SparseMoeBlock
from engine.model.profile_load import load_profile_model
from engine.model.quant_experts import QuantExperts, quant_experts
from engine.request import SamplingParams
from engine.testing.synthetic_quant import SyntheticProfileSource, dequantized_twin, synthetic_profile
from engine.testing.tiny import tiny_hf_config

PARAMS = SamplingParams(temperature=0.0, max_tokens=8)


@functools.cache
def models():
    """(ours, twin): the twin dense everywhere (the exact dequantization); ours the twin with the quantized routed
    experts put back, so the experts are the only difference (and the 248k-row output head stays a dense matmul:
    its exact CPU reference would decode the whole head every step)."""
    config = ModelConfig.from_hf(tiny_hf_config("moe"))
    profile = synthetic_profile("groupwise-int", config)
    source = SyntheticProfileSource(profile, config, "cpu", seed=3)
    quantized = load_profile_model(source, profile, config, "cpu", torch.float32, with_mtp=True)
    twin, ours = dequantized_twin(quantized), dequantized_twin(quantized)
    blocks = [m for m in ours.modules() if isinstance(m, SparseMoeBlock)]
    for block, experts in zip(blocks, quant_experts(quantized), strict=True):
        block.experts = experts
    return ours, twin


def core(model, **flags) -> EngineCore:
    flags.setdefault("max_context", 512)
    flags.setdefault("prefill_chunk_multiple", 1)
    config = EngineConfig.from_flags(page_size=16, **flags)
    return EngineCore(model, tiny_loaded("moe").tokenizer, config, seed=0)


def test_the_mtp_layer_shares_the_scratch():
    model, twin = models()
    layers = quant_experts(model)
    assert model.mtp is not None and isinstance(model.mtp.layers[0].mlp.experts, QuantExperts)
    assert len(layers) == model.config.num_hidden_layers + 1
    assert len({id(layer.scratch) for layer in layers}) == 1 and layers[0].scratch.allocations == 1
    assert not quant_experts(twin)


def test_greedy_tokens_equal_the_twins_with_prefix_reuse_and_mtp():
    model, twin = models()
    first = [prompt(20, 1), prompt(90, 2)]
    with one_thread():
        want1 = run(core(twin, prefix_reuse=False, max_concurrency=2), first, PARAMS)[0]
        assert len({t for out in want1 for t in out}) > 2, "the twin's tokens do not vary: a weak check"
        reuse = core(model, max_concurrency=2)
        assert run(reuse, first, PARAMS)[0] == want1
        second = [p + o + prompt(7, 3 + i) for i, (p, o) in enumerate(zip(first, want1, strict=True))]
        want2 = [run(core(twin, prefix_reuse=False), [s], PARAMS)[0][0] for s in second]
        got2, finish = run(reuse, second, PARAMS)
        assert got2 == want2
        assert sum(f.num_cached_tokens for f in finish.values()) > 0, "no prefix was reused"
        spec = core(model, spec="mtp", draft_tokens=2, max_concurrency=2)
        assert run(spec, first, PARAMS)[0] == want1
