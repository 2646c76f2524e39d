"""A groupwise-int MoE artifact keeps its routed experts quantized (engine/model/quant_experts.py), on the CPU.

The tiny MoE checkpoint ``moe_a`` (6 experts, top 2, H 72: partial groups) goes through ``ninfer-artifact convert
--weights-id groupwise-int`` and ``load_model``. Checked:

- the loaded experts hold the artifact's payload bytes exactly, and no dense bank exists (memory accounting
  counts those bytes);
- logits against twins whose banks are the exact dequantization: prefill (96 tokens: the many-token path,
  dequantized into the shared scratch, then the dense path) is BITWISE the experts-only twin's; decode steps
  (the few-token path, ``quant_moe_experts``'s fp32 reference here) agree to 1e-5 (the twin's CPU path sums
  the same products in another order); the fully dequantized twin (every quantized layer dense) to 1e-4, as
  the other profile tests; one layer's two paths are bitwise the dense path on the twin's banks;
- one scratch for all layers, allocated once, sized for a layer's gate_up bank (down goes into the same memory,
  asked for after gate_up's last read), reused; ``.to(dtype)`` leaves the payload alone;
- ``NINFER_MOE_EXPERTS=dequantized`` loads dense banks (the same prefill logits, bitwise);
- ``NINFER_MOE_PREFILL=quant`` (the grouped GEMM on the quantized banks; its reference here) gives the same logits
  as the scratch path, bitwise in fp32.
"""

from __future__ import annotations

import copy

import pytest
import torch

from engine.artifact.cli import main as artifact_cli
from engine.artifact.container import read_artifact
from engine.artifact.profiles import TensorSpec
from engine.model import allocate_model_cache, load_model
from engine.model import quant_experts as qe
from engine.model.mlp import Experts, SparseMoeBlock, routed_experts
from engine.model.profile_load import SKIPPED_PREFIXES
from engine.model.quant_experts import QUANT_MAX_TOKENS, QuantExperts, quant_experts
from engine.testing.bench.steps import weight_bytes
from engine.testing.synthetic import GEOMETRIES
from engine.testing.synthetic_quant import dequantized_twin, quantized_bytes, synthetic_profile
from kernels import _dispatch
from kernels.moe import moe_experts_ref
from kernels.quant import Q4, Q5, geometry, quant_moe_grouped_ref


@pytest.fixture(scope="module")
def converted(tiny, tmp_path_factory):
    ckpt = tiny("moe_a")
    path = tmp_path_factory.mktemp("quant_experts") / "moe-groupwise.ninfer"
    argv = ["convert", str(ckpt.path), str(path), "--model-id", "ninfer-tiny-moe"]
    argv += ["--weights-id", "groupwise-int"]
    assert artifact_cli(argv) == 0
    artifact = read_artifact(path)
    return ckpt, artifact, load_model(artifact, dtype=torch.float32)


def experts_twin(model):
    """A copy of ``model`` whose routed experts alone are dense (the exact dequantization): every other layer is
    the same quantized one, so the experts are the only difference."""
    twin = copy.deepcopy(model)
    for block in twin.modules():
        if isinstance(block, SparseMoeBlock) and isinstance(block.experts, QuantExperts):
            block.experts = block.experts.dequantized(torch.float32)
    return twin


def test_the_experts_hold_the_artifacts_bytes_and_no_dense_bank(converted):
    ckpt, artifact, model = converted
    layers = [layer.mlp.experts for layer in model.model.layers]
    assert all(isinstance(e, QuantExperts) for e in layers) and quant_experts(model) == layers
    entries = {e.name: e for e in artifact.directory.tensors}
    routed = 0
    for index, experts in enumerate(layers):
        for bank, leaf in ((experts.gate_up, "routed_gate_up"), (experts.down, "routed_down")):
            name = f"text/layers/{index}/moe/{leaf}"
            assert bank.payload.dtype == torch.uint8
            assert bytes(bank.payload.numpy()) == bytes(artifact.raw_bytes(name)), name
            assert (bank.format, list(bank.shape)) == (entries[name].format, list(entries[name].shape))
            assert not bank.qweight.gemv_layout  # the MoE kernels read the stored byte order
            routed += entries[name].bytes
        assert (experts.gate_up.format, experts.down.format) == (Q4, Q5)
    dense = [n for n, _ in model.named_parameters() if ".experts." in n]
    assert not dense, f"dense expert banks: {dense}"
    assert weight_bytes(model)["experts"] == routed  # the bench's accounting counts the payloads
    assert quantized_bytes(model) >= routed


def _logits(model, config, paged, steps):
    """Logits of a 96-token prefill then ``steps`` single-token decode steps (greedy, fed back)."""
    Driver, Lane = paged
    cache = allocate_model_cache(config, num_pages=4, page_size=64, num_state_slots=1, dtype=torch.float32)
    driver, lane = Driver(cache), Lane(slot=0)
    prompt = torch.randint(0, config.vocab_size, (96,), generator=torch.Generator().manual_seed(5)).tolist()
    out = [model.compute_logits(model(driver.batch([lane], [prompt]), cache))]
    for token in steps:
        out.append(model.compute_logits(model(driver.batch([lane], [[token]]), cache)))
    return out


def test_logits_match_the_dequantized_twins_on_both_paths(converted, paged, monkeypatch):
    ckpt, _, model = converted
    calls = {"few": 0, "gate_up": 0, "down": 0}
    few, gate_up, down = qe.quant_moe_experts, QuantExperts.dense_gate_up, QuantExperts.dense_down

    def count_few(*args):
        calls["few"] += 1
        return few(*args)

    def count_gate_up(self, *args):
        calls["gate_up"] += 1
        return gate_up(self, *args)

    def count_down(self, *args):
        calls["down"] += 1
        return down(self, *args)

    monkeypatch.setattr(qe, "quant_moe_experts", count_few)
    monkeypatch.setattr(QuantExperts, "dense_gate_up", count_gate_up)
    monkeypatch.setattr(QuantExperts, "dense_down", count_down)
    steps = [11, 402, 7]
    with torch.inference_mode():
        ours = _logits(model, ckpt.config, paged, steps)
        layers = ckpt.config.num_hidden_layers
        assert calls == {"few": layers * len(steps), "gate_up": layers, "down": layers}, calls
        same = _logits(experts_twin(model), ckpt.config, paged, steps)
        full = _logits(dequantized_twin(model), ckpt.config, paged, steps)
    assert torch.equal(ours[0], same[0]), "prefill (scratch + dense path) differs from the experts-only twin"
    for step, (a, b) in enumerate(zip(ours[1:], same[1:], strict=True)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"decode step {step}")
    for a, b in zip(ours, full, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert ours[0].std() > 0


@pytest.mark.parametrize("tokens", [1, 5, QUANT_MAX_TOKENS, QUANT_MAX_TOKENS + 1, 97])
def test_one_layer_is_bitwise_the_dense_path_on_its_dequantized_banks(converted, tokens):
    _, _, model = converted
    experts = model.model.layers[3].mlp.experts
    dense = experts.dequantized(torch.float32)
    assert isinstance(dense, Experts)
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, experts.hidden_size, generator=gen)
    weights = torch.rand(tokens, 2, generator=gen)
    ids = torch.stack([torch.randperm(experts.num_experts, generator=gen)[:2] for _ in range(tokens)])
    shared = torch.randn(tokens, experts.hidden_size, generator=gen)
    with torch.inference_mode():
        got = experts(x, weights, ids, shared)
        if tokens <= QUANT_MAX_TOKENS:  # quant_moe_experts's reference: fp32 on the exact banks, one rounding
            want = moe_experts_ref(x, dense.gate_up_proj, dense.down_proj, weights, ids) + shared
        else:  # the scratch holds the banks in the model dtype; the dense path runs on them
            want = routed_experts(x, dense.gate_up_proj, dense.down_proj, weights, ids, shared)
    assert torch.equal(got, want)


def test_one_scratch_serves_every_layer_and_is_allocated_once(converted):
    ckpt, _, model = converted
    layers = quant_experts(model)
    scratch = layers[0].scratch
    assert all(layer.scratch is scratch for layer in layers)
    assert scratch.allocations == 1
    c = ckpt.config
    # the gate_up bank [E, 2I, H]: down [E, H, I] goes into the same memory after it (not beside it)
    assert scratch.buffer.numel() == 2 * c.num_experts * c.moe_intermediate_size * c.hidden_size
    assert scratch.nbytes == qe.scratch_bytes(model) == scratch.buffer.numel() * 4
    pointer = scratch.buffer.data_ptr()
    for layer in layers[:3]:
        dense = layer.dequantized(torch.float32)
        gate_up = layer.dense_gate_up(torch.device("cpu"), torch.float32)
        assert gate_up.data_ptr() == pointer and gate_up.numel() == scratch.buffer.numel()
        assert torch.equal(gate_up, dense.gate_up_proj)
        down = layer.dense_down(torch.device("cpu"), torch.float32)
        assert down.data_ptr() == pointer and torch.equal(down, dense.down_proj)
    assert scratch.allocations == 1
    loaded_in_inference = qe.ExpertScratch()
    with torch.inference_mode():
        loaded_in_inference.allocate(8, "cpu", torch.float32)
    with torch.no_grad():  # a forward outside inference mode still writes it
        loaded_in_inference.bank((2, 4), torch.device("cpu"), torch.float32).fill_(1.0)
    assert loaded_in_inference.allocations == 1


def test_a_deferred_down_bank_is_asked_for_after_the_last_read_of_gate_up(converted):
    """``routed_experts`` with ``down`` a function (what ``QuantExperts`` passes: down then overwrites gate_up in
    the scratch): gate_up poisoned when down is produced changes nothing, bitwise."""
    _, _, model = converted
    dense = model.model.layers[2].mlp.experts.dequantized(torch.float32)
    tokens = QUANT_MAX_TOKENS + 3
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(tokens, dense.gate_up_proj.shape[2], generator=gen)
    weights = torch.rand(tokens, 2, generator=gen)
    ids = torch.stack([torch.randperm(dense.gate_up_proj.shape[0], generator=gen)[:2] for _ in range(tokens)])
    shared = torch.randn(tokens, x.shape[1], generator=gen)
    gate_up = dense.gate_up_proj.clone()
    asked = []

    def down() -> torch.Tensor:
        asked.append(True)
        gate_up.fill_(float("nan"))
        return dense.down_proj

    with torch.inference_mode():
        want = routed_experts(x, dense.gate_up_proj, dense.down_proj, weights, ids, shared)
        got = routed_experts(x, gate_up, down, weights, ids, shared)
        ref = moe_experts_ref(x, dense.gate_up_proj, dense.down_proj, weights, ids)
        assert torch.equal(want, ref + shared)
    assert asked == [True] and torch.equal(got, want)
    with pytest.raises(AssertionError, match="a deferred down bank needs the many-token paths"):
        routed_experts(x[:2], gate_up, down, weights[:2], ids[:2], shared[:2])


def test_the_dequantized_switch_loads_dense_banks_with_the_same_prefill(converted, paged, monkeypatch):
    ckpt, artifact, model = converted
    monkeypatch.setenv("NINFER_MOE_EXPERTS", "dequantized")
    dense = load_model(artifact, dtype=torch.float32)
    assert not quant_experts(dense) and isinstance(dense.model.layers[0].mlp.experts, Experts)
    with torch.inference_mode():
        assert torch.equal(
            _logits(dense, ckpt.config, paged, [])[0], _logits(model, ckpt.config, paged, [])[0]
        )
    monkeypatch.setenv("NINFER_MOE_EXPERTS", "int4")
    with pytest.raises(ValueError, match="NINFER_MOE_EXPERTS='int4': expected 'quantized', 'dequantized'"):
        load_model(artifact, dtype=torch.float32)


def test_a_cast_or_move_keeps_the_payload_and_its_views(converted):
    _, _, model = converted
    twin = copy.deepcopy(model)
    before = {n: b.clone() for n, b in twin.named_buffers() if ".experts." in n}
    twin.to(device="cpu", dtype=torch.bfloat16)
    for name, buffer in twin.named_buffers():
        if ".experts." in name:
            assert buffer.dtype == torch.uint8 and torch.equal(buffer, before[name]), name
    bank = twin.model.layers[0].mlp.experts.gate_up
    start = bank.payload.data_ptr()
    assert start <= bank.qweight.codes.data_ptr() < start + bank.payload.numel()
    assert start <= bank.qweight.scales.data_ptr() < start + bank.payload.numel()


def test_the_35b_a3b_profile_leaves_room_on_a_32_gib_card():
    """What the 35B-A3B groupwise-int model holds on the device, from its inventory: the stored objects (MTP off)
    plus one scratch; dense bf16 banks instead would not fit (the H200 check: tests/model/test_quantized_experts_gpu.py)."""
    config = GEOMETRIES["qwen3.6-35b-a3b"]
    profile = synthetic_profile("qwen3.6-35b-a3b/groupwise-int", config)
    specs = [s for s in profile.objects(config) if isinstance(s, TensorSpec)]
    specs = [s for s in specs if not s.name.startswith((*SKIPPED_PREFIXES, "mtp/"))]
    stored = sum(s.bytes for s in specs)
    routed = sum(s.bytes for s in specs if "/moe/routed_" in s.name)
    bank_pair = 3 * config.num_experts * config.moe_intermediate_size * config.hidden_size * 2  # bf16
    gib = 1024**3
    e, h, i = config.num_experts, config.hidden_size, config.moe_intermediate_size
    payload = torch.empty(geometry(Q4, (e * 2 * i, h)).payload_bytes, dtype=torch.uint8, device="meta")
    layer = QuantExperts(e, h, i, qe.QuantBank(Q4, payload, (e * 2 * i, h)), qe.ExpertScratch())
    scratch = layer.scratch_numel * 2  # the scratch a layer sizes: its gate_up bank (down reuses that memory)
    assert scratch == gib  # E 256 x 2I 1024 x H 2048 in bf16: 1.0 GiB (the two banks side by side: 1.5)
    assert stored + scratch < 21 * gib  # 19.6 + 1.0 GiB: ~11 GiB left for KV, GDN state, activations
    assert stored - routed + config.num_hidden_layers * bank_pair > 32 * gib  # dense experts: 62 GiB


def test_the_block_hands_its_shared_gate_to_the_quantized_experts(converted, monkeypatch):
    """``NINFER_QUANT_MOE_SHARED=fused`` (the default): the MoE block passes its shared expert's output ungated
    with the gate's weight, and the experts' decode adds ``sigmoid(gate . x) * shared`` (in fp32, rounded once);
    ``separate``: the block gates it and the experts add it. The same block output to fp32 roundings, and the
    prefill path (many tokens) bitwise either way."""
    _, _, model = converted
    block = model.model.layers[0].mlp
    seen = []
    forward = QuantExperts.forward

    def spy(self, *args):
        seen.append(len(args))
        return forward(self, *args)

    monkeypatch.setattr(QuantExperts, "forward", spy)
    gen = torch.Generator().manual_seed(2)
    hidden = block.experts.hidden_size
    few, many = (
        torch.randn(3, hidden, generator=gen),
        torch.randn(QUANT_MAX_TOKENS + 6, hidden, generator=gen),
    )
    out = {}
    with torch.inference_mode():
        for mode in ("fused", "separate"):
            monkeypatch.setattr(_dispatch, "QUANT_MOE_SHARED", mode)
            out[mode] = (block(few), block(many))
    assert seen == [5, 5, 4, 4]  # (x, weights, ids, shared, gate weight) fused; the gated shared separate
    torch.testing.assert_close(out["fused"][0], out["separate"][0], rtol=1e-5, atol=1e-6)
    assert torch.equal(out["fused"][1], out["separate"][1])


def test_the_quant_prefill_switch_computes_what_the_scratch_path_computes(converted, paged, monkeypatch):
    """``NINFER_MOE_PREFILL=quant``: a prefill's quantized MoE layers take ``quant_moe_grouped`` (on the CPU its
    reference: the dense path's math on the banks dequantized to the model dtype) instead of the scratch; in fp32
    the logits are bitwise the default's (``scratch``), and the scratch is neither read nor written; decode
    (few tokens) is unchanged."""
    ckpt, _, model = converted
    calls = {"grouped": 0, "scratch": 0}
    grouped, gate_up = qe.quant_moe_grouped, QuantExperts.dense_gate_up

    def count_grouped(*args):
        calls["grouped"] += 1
        return grouped(*args)

    def count_scratch(self, *args):
        calls["scratch"] += 1
        return gate_up(self, *args)

    monkeypatch.setattr(qe, "quant_moe_grouped", count_grouped)
    monkeypatch.setattr(QuantExperts, "dense_gate_up", count_scratch)
    with torch.inference_mode():
        want = _logits(model, ckpt.config, paged, [11, 402])
        assert calls == {"grouped": 0, "scratch": ckpt.config.num_hidden_layers}, calls
        monkeypatch.setattr(_dispatch, "MOE_PREFILL", "quant")
        got = _logits(model, ckpt.config, paged, [11, 402])
    assert calls == {"grouped": ckpt.config.num_hidden_layers, "scratch": ckpt.config.num_hidden_layers}, (
        calls
    )
    for step, (a, b) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(a, b), f"step {step}: NINFER_MOE_PREFILL=quant differs from scratch"


def test_the_quant_prefill_reference_in_bf16_rounds_as_the_dense_path(converted):
    """In bf16 the reference rounds the weights, the activation and each expert's output to bf16 (the dense
    grouped path's roundings, bar gate/up before the activation): close to the scratch path on the CPU."""
    _, _, model = converted
    experts = model.model.layers[1].mlp.experts
    tokens = QUANT_MAX_TOKENS + 9
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(tokens, experts.hidden_size, generator=gen).bfloat16()
    weights = torch.rand(tokens, 2, generator=gen)
    ids = torch.stack([torch.randperm(experts.num_experts, generator=gen)[:2] for _ in range(tokens)])
    shared = torch.randn(tokens, experts.hidden_size, generator=gen).bfloat16()
    with torch.inference_mode():
        dense = experts.dequantized(torch.bfloat16)
        want = routed_experts(x, dense.gate_up_proj, dense.down_proj, weights, ids, shared)
        got = quant_moe_grouped_ref(x, experts.gate_up.qweight, experts.down.qweight, weights, ids, shared)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_the_quant_prefill_switch_loads_no_scratch(converted, paged, monkeypatch):
    """Under ``NINFER_MOE_PREFILL=quant`` the loader allocates no scratch (prefill never reads it) and the logits are
    the default's; switched back to ``scratch`` at run time, the first prefill allocates it (``ExpertScratch.bank``)."""
    ckpt, artifact, model = converted
    monkeypatch.setattr(_dispatch, "MOE_PREFILL", "quant")
    lean = load_model(artifact, dtype=torch.float32)
    assert quant_experts(lean) and qe.scratch_bytes(lean) == 0 and qe.scratch_bytes(model) > 0
    with torch.inference_mode():
        want = _logits(model, ckpt.config, paged, [])[0]
        assert torch.equal(_logits(lean, ckpt.config, paged, [])[0], want)
        assert qe.scratch_bytes(lean) == 0
        monkeypatch.setattr(_dispatch, "MOE_PREFILL", "scratch")
        assert torch.equal(_logits(lean, ckpt.config, paged, [])[0], want)
    assert qe.scratch_bytes(lean) == qe.scratch_bytes(model)
