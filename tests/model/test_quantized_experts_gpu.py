"""On the GPU: a groupwise-int MoE model whose routed experts stay quantized (engine/model/quant_experts.py) runs
the Triton kernels (``quant_moe_experts`` for few tokens, ``dequantize_to`` into the shared scratch then the grouped
GEMMs for more) and matches its dequantized twin; decode replays CUDA graphs; the 35B-A3B geometry's weights fit
a 32 GiB card with room for the KV pool (``pytest -m gpu tests/model/test_quantized_experts_gpu.py``).

One layer's few-token path agrees with ``quant_moe_experts_ref`` (fp32 on the exact banks) to the kernel tests'
relative RMS (6e-3: fp32 sums in another order, one bf16 rounding); its many-token path is BITWISE the dense
grouped path on the twin's bf16 banks (``dequantize_to`` is bitwise ``dequantize(...).to(bf16)``). Logits of a
prefill (96 tokens) and decode steps agree with the fully dequantized twin within 3e-2 relative RMS (the twin
rounds every weight to bf16; the quantized layers read the exact values), as the profile GPU tests.
"""

from __future__ import annotations

import pytest
import torch

from engine.model import allocate_model_cache, make_forward_batch
from engine.model.mlp import routed_experts
from engine.model.quant_experts import QUANT_MAX_TOKENS, QuantExperts, quant_experts
from engine.testing.bench.steps import make_runner, run_decode, run_prefill, weight_bytes
from engine.testing.synthetic import GEOMETRIES
from engine.testing.synthetic_quant import build_synthetic_quantized, dequantized_twin
from engine.testing.tiny import tiny_hf_config
from kernels.moe import moe_route_ref
from kernels.quant import quant_moe_experts_ref

pytestmark = pytest.mark.gpu


def _rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.fixture(scope="module")
def tiny_moe():
    from engine.model.config import ModelConfig

    config = ModelConfig.from_hf(tiny_hf_config("moe"))
    model = build_synthetic_quantized(config, "groupwise-int", device="cuda")
    return config, model, dequantized_twin(model)


@pytest.mark.parametrize("tokens", [1, 3, 8, QUANT_MAX_TOKENS, QUANT_MAX_TOKENS + 1, 300])
def test_one_layer_on_both_paths(tiny_moe, tokens):
    config, model, twin = tiny_moe
    experts = model.model.layers[1].mlp.experts
    dense = twin.model.layers[1].mlp.experts
    assert isinstance(experts, QuantExperts) and experts.gate_up.payload.is_cuda
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, config.hidden_size, device="cuda", generator=gen).bfloat16()
    weights, ids = moe_route_ref(torch.randn(tokens, config.num_experts, device="cuda", generator=gen),
                                 config.num_experts_per_tok)  # fmt: skip
    shared = torch.zeros_like(x)
    got = experts(x, weights, ids, shared)
    if tokens <= QUANT_MAX_TOKENS:
        want = quant_moe_experts_ref(x, experts.gate_up.qweight, experts.down.qweight, weights, ids)
        assert _rel_rms(got, want) < 6e-3
    else:
        want = routed_experts(x, dense.gate_up_proj, dense.down_proj, weights, ids, shared)
        assert torch.equal(got, want), f"T={tokens}: the scratch path differs from the dense path"


def test_logits_match_the_twin_and_decode_replays_graphs(tiny_moe):
    config, model, twin = tiny_moe
    prompt = torch.randint(0, config.vocab_size, (96,), generator=torch.Generator().manual_seed(3)).tolist()
    results = []
    for m in (model, twin):
        cache = allocate_model_cache(config, num_pages=4, page_size=64, num_state_slots=1, dtype=torch.bfloat16,
                                     device="cuda")  # fmt: skip
        batch = make_forward_batch([prompt], [0], [[0, 1]], [0], 64, device="cuda")
        first = m.compute_logits(m(batch, cache), batch.last_token_indices()).float()
        step = make_forward_batch([[int(first.argmax())]], [96], [[0, 1]], [0], 64, device="cuda")
        results.append(torch.cat([first, m.compute_logits(m(step, cache)).float()]))
    assert _rel_rms(results[0], results[1]) < 3e-2
    runner = make_runner(model, 64, 9, "bf16", True, 1024)
    assert runner.graphs is not None, "no CUDA graphs captured"
    assert run_decode(runner, config.vocab_size, 4, 16, 0, 2) > 0
    assert runner.num_graph_steps > 0, "decode steps ran eagerly"


def test_the_35b_a3b_geometry_keeps_its_experts_quantized_under_32_gib():
    config = GEOMETRIES["qwen3.6-35b-a3b"]
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    model = build_synthetic_quantized(config, "groupwise-int", device="cuda")
    held = torch.cuda.memory_allocated() - before
    layers = quant_experts(model)
    assert len(layers) == config.num_hidden_layers
    assert not [n for n, _ in model.named_parameters() if ".experts." in n]
    scratch = layers[0].scratch
    assert scratch.allocations == 1
    assert scratch.nbytes == 3 * config.num_experts * config.moe_intermediate_size * config.hidden_size * 2
    weights = weight_bytes(model)
    print(f"35B-A3B groupwise-int: {held / 1024**3:.2f} GiB held (experts {weights['experts'] / 1024**3:.2f}"
          f" GiB quantized, scratch {scratch.nbytes / 1024**3:.2f} GiB)")  # fmt: skip
    assert held < 24 * 1024**3, f"{held / 1024**3:.2f} GiB: too little of a 32 GiB card left for the KV"
    runner = make_runner(model, 40, 2, "int8", False, 2048)
    assert run_prefill(runner, config.vocab_size, 1024, 1024) > 0  # the scratch path
    assert run_decode(runner, config.vocab_size, 1, 4, 0, 1) > 0  # the streaming path
