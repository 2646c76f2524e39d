"""On the GPU: a groupwise-int MoE model whose routed experts stay quantized (engine/model/quant_experts.py) runs
the Triton kernels (``quant_moe_experts`` for few tokens, ``dequantize_to`` into the shared scratch then the grouped
GEMMs for more) and matches its dequantized twin; decode replays CUDA graphs; the 35B-A3B geometry's weights fit
a 32 GiB card with room for the KV pool (``pytest -m gpu tests/model/test_quantized_experts_gpu.py``).

A decode MoE block launches 4 kernels fewer than session 11's (the shared expert's gate GEMV, sigmoid, product and
add now inside the quantized expert kernels; also under the interpreter: `TRITON_INTERPRET=1 ... -k launches`).

One layer's few-token path agrees with ``quant_moe_experts_ref`` (fp32 on the exact banks) to the kernel tests'
relative RMS (6e-3: fp32 sums in another order, one bf16 rounding); its many-token path is BITWISE the dense
grouped path on the twin's bf16 banks (``dequantize_to`` is bitwise ``dequantize(...).to(bf16)``). Logits of a
prefill (96 tokens) and decode steps agree with the fully dequantized twin within 3e-2 relative RMS (the twin
rounds every weight to bf16; the quantized layers read the exact values), as the profile GPU tests.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
import torch
from kernel_device import interpreter_patches, kernel_device
from torch.utils._python_dispatch import TorchDispatchMode

import kernels._dispatch
from engine.model import allocate_model_cache, make_forward_batch
from engine.model.mlp import routed_experts
from engine.model.quant_experts import QUANT_MAX_TOKENS, QuantExperts, quant_experts
from engine.testing.bench.steps import make_runner, run_decode, run_prefill, weight_bytes
from engine.testing.synthetic import GEOMETRIES
from engine.testing.synthetic_quant import build_synthetic_quantized, dequantized_twin
from engine.testing.tiny import tiny_hf_config
from kernels._dispatch import INTERPRET
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
    # one bank at a time: gate_up [E, 2I, H] in bf16, down into the same memory: 1.0 GiB (both side by side: 1.5)
    assert scratch.nbytes == 2 * config.num_experts * config.moe_intermediate_size * config.hidden_size * 2
    weights = weight_bytes(model)
    print(f"35B-A3B groupwise-int: {held / 1024**3:.2f} GiB held (experts {weights['experts'] / 1024**3:.2f}"
          f" GiB quantized, scratch {scratch.nbytes / 1024**3:.2f} GiB)")  # fmt: skip
    assert held < 24 * 1024**3, f"{held / 1024**3:.2f} GiB: too little of a 32 GiB card left for the KV"
    runner = make_runner(model, 40, 2, "int8", False, 2048)
    assert run_prefill(runner, config.vocab_size, 1024, 1024) > 0  # the scratch path
    assert run_decode(runner, config.vocab_size, 1, 4, 0, 1) > 0  # the streaming path


# torch ops that launch no kernel on a GPU (allocations, views), left out of the interpreter's count
_NO_KERNEL = {
    "empty", "empty_like", "empty_strided", "new_empty", "view", "_unsafe_view", "reshape", "split",
    "split_with_sizes", "chunk", "t", "transpose", "slice", "select", "unsqueeze", "squeeze", "expand",
    "as_strided", "detach", "alias", "permute", "unbind", "set_",
}  # fmt: skip


def _launches(fn: Callable[[], object]) -> list[str]:
    """The kernels ``fn`` launches, in order: on the GPU the profiler's CUDA kernels; under the interpreter the
    Triton launches and the torch ops that launch a kernel on a GPU (``aten.<op>``; not those the interpreter's
    own launch machinery runs)."""
    names: list[str] = []
    if not INTERPRET:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    import triton.runtime.interpreter as interpreter

    inside = []
    run = interpreter.InterpretedFunction.run

    def counting_run(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        names.append(self.fn.__name__)
        inside.append(True)
        try:
            return run(self, *args, **kwargs)
        finally:
            inside.pop()

    class TorchOps(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            op = func.overloadpacket.__name__
            if not inside and op not in _NO_KERNEL:
                names.append(f"aten.{op}")
            return func(*args, **(kwargs or {}))

    with pytest.MonkeyPatch.context() as mp, TorchOps():
        mp.setattr(interpreter.InterpretedFunction, "run", counting_run)
        fn()
    return names


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_decode_block_launches_no_shared_gate_or_add_kernel(version, monkeypatch):
    """A decode token through a quantized MoE block (router, route, the W8 shared expert, the quantized experts)
    launches exactly the kernels of ``NINFER_QUANT_MOE_SHARED=separate`` (session 11's decode) less the shared
    gate's GEMV, its sigmoid, the product and the add; the outputs agree to bf16 roundings."""
    from engine.model.config import ModelConfig

    monkeypatch.setattr(kernels._dispatch, "QUANT_MOE_MODE", version)
    device = kernel_device()
    config = ModelConfig.from_hf(tiny_hf_config("moe"))
    model = build_synthetic_quantized(config, "groupwise-int", device=device)
    block = model.model.layers[1].mlp
    x = torch.randn(1, config.hidden_size, device=device).bfloat16()
    outs: list[torch.Tensor] = []
    with torch.inference_mode(), interpreter_patches():
        block(x)  # first-call work (a lazily built buffer) out of the count
        fused = _launches(lambda: outs.append(block(x)))
        with monkeypatch.context() as mp:
            mp.setattr(kernels._dispatch, "QUANT_MOE_SHARED", "separate")
            separate = _launches(lambda: outs.append(block(x)))
    print(f"{version}: {len(separate)} launches a decode MoE block before, {len(fused)} now: {fused}")
    gone, new = Counter(separate) - Counter(fused), Counter(fused) - Counter(separate)
    assert not new, f"the fused block launches {new} that the separate one did not"
    down = "_quant_moe_down_kernel" if version == "v1" else "_quant_moe_down_v2_kernel"
    assert fused.count(down) == 1 and sum(gone.values()) >= 4, (fused, gone)
    if INTERPRET:
        assert gone == Counter(["_linear_gemv_kernel", "aten.sigmoid", "aten.mul", "aten.add"]), gone
    assert _rel_rms(outs[0], outs[1]) < 1e-2


@pytest.mark.parametrize("tokens", [QUANT_MAX_TOKENS + 1, 300])
def test_the_quant_prefill_switch_on_one_layer(tiny_moe, tokens, monkeypatch):
    """``NINFER_MOE_PREFILL=quant``: a layer's many-token path runs the grouped GEMM on the quantized banks (no
    scratch) and agrees with the scratch path (the dense path on the twin's bf16 banks) to 1e-2 relative RMS (the
    dense path rounds gate and up to bf16 before the activation; the kernel does not), and with its reference."""
    from kernels.quant import quant_moe_grouped_ref

    config, model, twin = tiny_moe
    experts = model.model.layers[1].mlp.experts
    dense = twin.model.layers[1].mlp.experts
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, config.hidden_size, device="cuda", generator=gen).bfloat16()
    weights, ids = moe_route_ref(torch.randn(tokens, config.num_experts, device="cuda", generator=gen),
                                 config.num_experts_per_tok)  # fmt: skip
    shared = torch.randn(tokens, config.hidden_size, device="cuda", generator=gen).bfloat16() * 0.1
    monkeypatch.setattr(kernels._dispatch, "MOE_PREFILL", "quant")
    monkeypatch.setattr(QuantExperts, "dense_gate_up", None)  # the scratch path would fail: it must not run
    got = experts(x, weights, ids, shared)
    want = routed_experts(x, dense.gate_up_proj, dense.down_proj, weights, ids, shared)
    assert _rel_rms(got, want) < 1e-2
    ref = quant_moe_grouped_ref(x, experts.gate_up.qweight, experts.down.qweight, weights, ids, shared)
    assert _rel_rms(got, ref) < 6e-3
