"""On the GPU: synthetic quantized weights drawn on the device run the Triton kernels and match their dequantized
bf16 twin; the bench's fit report proves a pool under a memory cap (run by the lead on an H200:
``pytest -m gpu tests/engine/test_synthetic_quant_gpu.py``)."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.core import apply_memory_limit
from engine.testing.bench.fit import fit_report
from engine.testing.bench.steps import make_runner, run_decode
from engine.testing.synthetic import synthetic_config
from engine.testing.synthetic_quant import build_synthetic_quantized, dequantized_twin
from kernels.quant import FP8, NVFP4, Q6, dequantize, encode, view_planes

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("weights_id", ["groupwise-int", "qwen3.8-27b/groupwise-int"])
def test_tiny_quantized_decode_matches_its_twin_on_the_gpu(weights_id):
    config = synthetic_config("tiny-dense")
    model = build_synthetic_quantized(config, weights_id, device="cuda")
    assert model.model.embed_tokens.payload.is_cuda
    twin = dequantized_twin(model)
    for m in (model, twin):  # the engine's decode step runs (Triton GEMV on the quantized layers)
        assert run_decode(make_runner(m, 64, 9, "bf16", False, 1024), config.vocab_size, 4, 16, 0, 2) > 0
    for name in ("mlp.down_proj", "mlp.gate_up_proj", "linear_attn.out_proj"):
        layer, twin_layer = (
            model.model.layers[0].get_submodule(name),
            twin.model.layers[0].get_submodule(name),
        )
        for rows in (1, 8, 40):  # the GEMV, and the GEMM above 8 rows
            h = torch.randn(rows, layer.in_features, device="cuda", dtype=torch.bfloat16)
            torch.testing.assert_close(layer(h), twin_layer(h), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("fmt", [FP8, NVFP4, Q6])
def test_dequantize_replays_in_a_cuda_graph(fmt):
    """The exact dequantization (the quantized embedding's row lookup) captures in a CUDA graph: an H200 run found
    the mixed NVFP4/FP8 profile's capture failing on a host-to-device copy of the E4M3 table inside it (FP8
    embedding), so that profile's decode ran eagerly at twice the step time (the 27B mixed bench)."""
    qw = view_planes(fmt, encode(fmt, torch.randn(256, 512)).cuda(), (256, 512))
    want = dequantize(qw)
    out = torch.empty_like(want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(dequantize(qw))
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)


def test_quantized_decode_captures_cuda_graphs():
    """The tiny quantized model's decode steps replay CUDA graphs (the groupwise profile: NVFP4 needs N a multiple
    of 128, which the tiny geometry is not; the 27B benches show nvfp4 and nvfp4-mixed with cuda_graph true)."""
    config = synthetic_config("tiny-dense")
    model = build_synthetic_quantized(config, "groupwise-int", device="cuda")
    runner = make_runner(model, 64, 9, "bf16", True, 1024)
    assert runner.graphs is not None, "no CUDA graphs captured"
    assert run_decode(runner, config.vocab_size, 4, 16, 0, 2) > 0
    assert runner.num_graph_steps > 0, "decode steps ran eagerly"


def test_fit_report_proves_a_pool_under_a_cap():
    config = synthetic_config("tiny-dense")
    model = build_synthetic_quantized(config, "groupwise-int", device="cuda")
    limit = apply_memory_limit(EngineConfig(gpu_memory_limit=3), torch.device("cuda"))
    try:
        assert limit == 3 * 1024**3
        report = fit_report(model, limit, "int8", 1024)
        assert report["proved"] and report["pool_tokens"] > 1024
        assert report["per_lanes"][3]["max_context_each"] <= report["pool_tokens"] // 4
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
