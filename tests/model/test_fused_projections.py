"""Fused input projections (``Qwen3_5ForCausalLM.fuse_projections``): the fused model computes what the
unfused one does, holds the same parameters under fewer names, frees the originals, and fuses only once.

The CPU tests run the whole forward (fp32, torch references); the MoE shared expert's decode kernel
(``kernels.moe.moe_experts``, which reads the fused gate/up weight's two row halves in place) is checked
under ``-m gpu``: on CUDA, or on the CPU under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from kernel_device import kernel_device

from engine.model import allocate_model_cache, build_model, collect_weights
from engine.model.config import ModelConfig
from engine.model.mlp import SparseMoeBlock
from engine.model.qwen3_5 import Qwen3_5ForCausalLM
from engine.model.weights import expected_mtp_weights
from kernels.moe import moe_experts, moe_experts_ref, moe_route_ref

NAMES = ["dense_a", "moe_b"]
# the checkpoint names a fused model no longer has, and the fused names it has instead
SEPARATE = tuple("q_proj k_proj v_proj in_proj_qkv in_proj_z in_proj_b in_proj_a gate_proj up_proj".split())
FUSED = ("qkv_proj", "in_proj", "gate_up_proj")


def _build(ckpt, fuse: bool, with_mtp: bool = False, dtype: torch.dtype | None = None) -> Qwen3_5ForCausalLM:
    source = dict(ckpt.tensors)
    if with_mtp:
        gen = torch.Generator().manual_seed(3)
        mtp = expected_mtp_weights(ckpt.config)
        source.update({n: torch.randn(s, generator=gen) * 0.05 for n, s in sorted(mtp.items())})
    collected = collect_weights(source, source.__getitem__, ckpt.config, with_mtp)
    return build_model(ckpt.config, collected, dtype=dtype, with_mtp=with_mtp, fuse=fuse)


def _leaf_names(model: torch.nn.Module) -> set[str]:
    return {name.split(".")[-2] for name, _ in model.named_parameters() if name.endswith(".weight")}


def _tokens(n: int, vocab: int, seed: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _close(name: str, actual: torch.Tensor, expected: torch.Tensor, tol: float = 1e-5) -> None:
    rel = ((actual - expected).abs().max() / expected.abs().max()).item()
    assert rel < tol, f"{name}: max relative error {rel:.2e}"


def _run_steps(model: Qwen3_5ForCausalLM, config: ModelConfig, paged, with_mtp: bool) -> list[torch.Tensor]:
    """Logits of: two prompts prefilled in one batch, a mixed step (a chunk + a decode row), then decode
    steps of both (T == B: the decode paths); plus the MTP head's rows when present."""
    Driver, Lane = paged
    cache = allocate_model_cache(
        config, num_pages=24, page_size=16, num_state_slots=3, dtype=torch.float32, with_mtp=with_mtp
    )
    driver, lanes = Driver(cache), [Lane(slot=2), Lane(slot=0)]
    first, second = _tokens(37, config.vocab_size, 1), _tokens(21, config.vocab_size, 2)
    chunks = [[first[:30], second[:20]], [first[30:], second[20:]]]
    chunks += [[[first[step]], [second[step]]] for step in range(4)]
    out = []
    for chunk in chunks:
        hidden = model(batch := driver.batch(lanes, chunk), cache)
        out.append(model.compute_logits(hidden))
        if with_mtp:  # the MTP layer on the same rows (its own KV entries)
            out.append(model.compute_logits(model.forward_mtp(batch, hidden, cache)))
    return out


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("with_mtp", [False, True], ids=["text", "mtp"])
def test_fused_logits_equal_unfused(tiny, paged, name, with_mtp):
    ckpt = tiny(name)
    fused, plain = _build(ckpt, True, with_mtp), _build(ckpt, False, with_mtp)
    assert _leaf_names(fused).isdisjoint(SEPARATE) and set(FUSED) <= _leaf_names(fused)
    assert _leaf_names(plain).isdisjoint(FUSED)
    got = _run_steps(fused, ckpt.config, paged, with_mtp)
    expected = _run_steps(plain, ckpt.config, paged, with_mtp)
    # fp32: one concatenated GEMM sums in another order than the separate ones (the CPU GEMM's blocking
    # depends on N); over the tiny models' layers that reaches ~1e-5 of the largest logit (measured <= 8.6e-6)
    for step, (a, b) in enumerate(zip(got, expected, strict=True)):
        _close(f"{name} step {step}", a, b, 5e-5)


@pytest.mark.parametrize("name", NAMES)
def test_same_parameters_fewer_names(tiny, name):
    ckpt = tiny(name)
    fused, plain = _build(ckpt, True, with_mtp=True), _build(ckpt, False, with_mtp=True)
    fused_params, plain_params = dict(fused.named_parameters()), dict(plain.named_parameters())
    assert sum(p.numel() for p in fused_params.values()) == sum(p.numel() for p in plain_params.values())
    assert sum(p.nbytes for p in fused_params.values()) == sum(p.nbytes for p in plain_params.values())
    for layer in [*fused.model.layers, *fused.mtp.layers]:
        assert not any(hasattr(layer, n) for n in ("q_proj", "in_proj_qkv"))
        mixer = layer.linear_attn if layer.layer_type == "linear_attention" else layer.self_attn
        assert not any(hasattr(mixer, n) for n in SEPARATE)
    # every fused weight is its parts' rows, in the order the forward splits them
    for prefix, parts in (
        ("model.layers.3.self_attn.qkv_proj", ("q_proj", "k_proj", "v_proj")),
        ("model.layers.0.linear_attn.in_proj", ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")),
        ("mtp.layers.0.self_attn.qkv_proj", ("q_proj", "k_proj", "v_proj")),
    ):
        base = prefix.rsplit(".", 1)[0]
        expected = torch.cat([plain_params[f"{base}.{part}.weight"] for part in parts])
        assert torch.equal(fused_params[f"{prefix}.weight"], expected), prefix
    mlp = "model.layers.1.mlp." + ("shared_expert." if ckpt.config.is_moe else "")
    expected = torch.cat([plain_params[f"{mlp}{p}.weight"] for p in ("gate_proj", "up_proj")])
    assert torch.equal(fused_params[f"{mlp}gate_up_proj.weight"], expected)


def test_fusing_twice_is_a_no_op(tiny):
    model = _build(tiny("dense_a"), True)
    before = {name: p.data_ptr() for name, p in model.named_parameters()}
    assert model.fuse_projections() == 0
    assert {name: p.data_ptr() for name, p in model.named_parameters()} == before
    plain = _build(tiny("moe_b"), False, with_mtp=True)
    config = plain.config
    # per layer: the mixer and the dense MLP or the MoE shared expert; the MTP layer likewise
    assert plain.fuse_projections() == 2 * (config.num_hidden_layers + config.mtp_num_hidden_layers)
    assert plain.fuse_projections() == 0


@pytest.mark.parametrize("name", NAMES)
def test_the_loader_frees_the_separate_weights_while_fusing(tiny, name, monkeypatch):
    """build_model's own copies (here a dtype cast; on a GPU the device copies) of the separate projections
    are freed as they are fused, inside build_model: no name -> tensor dict or module keeps them, so loading
    never holds the projections twice (on CUDA fuse_projections then returns each module's blocks)."""
    ckpt = tiny(name)
    counts: list[tuple[int, int]] = []
    fuse = Qwen3_5ForCausalLM.fuse_projections

    def watch(model: Qwen3_5ForCausalLM) -> int:
        storages = [
            weakref.ref(p.untyped_storage())
            for full_name, p in model.named_parameters()
            if full_name.split(".")[-2] in SEPARATE
        ]
        fused = fuse(model)
        gc.collect()
        counts.append((len(storages), sum(ref() is not None for ref in storages)))
        return fused

    monkeypatch.setattr(Qwen3_5ForCausalLM, "fuse_projections", watch)
    model = _build(ckpt, True, with_mtp=True, dtype=torch.bfloat16)
    assert model.model.layers[0].linear_attn.in_proj.weight.dtype == torch.bfloat16
    ((total, alive),) = counts
    assert total > 0 and alive == 0, f"{alive} of {total} separate projection weights outlived the fusion"


def test_synthetic_models_are_fused():
    from engine.testing.synthetic import TINY_GEOMETRY, build_synthetic, synthetic_config

    model = build_synthetic(synthetic_config(TINY_GEOMETRY), device="cpu", dtype=torch.float32)
    names = _leaf_names(model)
    assert names.isdisjoint(SEPARATE) and {"qkv_proj", "in_proj", "gate_up_proj"} <= names


def _moe_block(dtype: torch.dtype, device: str) -> SparseMoeBlock:
    config = ModelConfig(
        model_type="qwen3_5_moe_text", vocab_size=100, hidden_size=64, num_hidden_layers=1,
        layer_types=("linear_attention",), num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        rms_norm_eps=1e-6, rope_theta=1e4, partial_rotary_factor=0.25, mrope_section=None,
        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=1,
        linear_num_value_heads=2, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
    )  # fmt: skip
    block = SparseMoeBlock(config).eval()
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
    return block.to(device=device, dtype=dtype)


def test_shared_expert_weights_are_views_of_the_fused_weight():
    block = _moe_block(torch.float32, "cpu")
    gate, up = block.shared_expert.gate_proj.weight.clone(), block.shared_expert.up_proj.weight.clone()
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(6))
    expected = block(x)
    assert block.shared_expert.fuse_projections()
    shared = block.shared_weights()
    fused = block.shared_expert.gate_up_proj.weight
    assert torch.equal(shared.gate_proj, gate) and torch.equal(shared.up_proj, up)
    assert shared.gate_proj.data_ptr() == fused.data_ptr()
    assert shared.up_proj.data_ptr() == fused.data_ptr() + gate.numel() * fused.element_size()
    assert shared.gate_proj.stride() == shared.up_proj.stride() == (64, 1)  # what moe_experts asserts
    _close("moe block", block(x), expected, 1e-6)
    weights, ids = moe_route_ref(torch.nn.functional.linear(x, block.gate.weight), block.top_k)
    experts = (x, block.experts.gate_up_proj, block.experts.down_proj, weights, ids)
    _close("moe_experts_ref", moe_experts_ref(*experts, shared), moe_experts_ref(*experts, shared._replace(
        gate_proj=gate, up_proj=up)), 1e-6)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shared_expert_decode_kernel_reads_the_fused_weight(dtype):
    """The decode path (``moe_experts`` with the shared expert, what ``SparseMoeBlock.forward`` runs on CUDA
    for few tokens) given the fused weight's row halves equals its reference on the unfused weights."""
    device = kernel_device()
    block = _moe_block(dtype, device)
    unfused = block.shared_weights()
    unfused = unfused._replace(gate_proj=unfused.gate_proj.clone(), up_proj=unfused.up_proj.clone())
    assert block.shared_expert.fuse_projections()
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(7)).to(device=device, dtype=dtype)
    weights, ids = moe_route_ref(torch.nn.functional.linear(x, block.gate.weight), block.top_k)
    experts = (x, block.experts.gate_up_proj, block.experts.down_proj, weights, ids)
    got = moe_experts(*experts, block.shared_weights())
    expected = moe_experts_ref(*(t.float() if t.is_floating_point() else t for t in experts), unfused._replace(
        **{k: v.float() for k, v in unfused._asdict().items()}))  # fmt: skip
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    _close("moe_experts with the fused shared expert", got.float(), expected.float(), tol)
    if device == "cuda" and x.shape[0] <= 64:  # the model's own decode path
        _close("SparseMoeBlock decode", block(x).float(), expected.float(), tol)
