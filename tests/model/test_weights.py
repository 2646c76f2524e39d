"""Weight inventory: expected names/shapes equal what HF writes; normalisation; strict, clear errors."""

from __future__ import annotations

import pytest
import torch

from engine.model import WeightInventoryError, collect_weights, expected_weights, normalize_name
from engine.model.weights import expected_mtp_weights


def _hf_param_shapes(hf_model) -> dict[str, tuple[int, ...]]:
    """HF's in-memory parameter names (fused experts, as the real checkpoints store them)."""
    return {n: tuple(p.shape) for n, p in hf_model.state_dict().items() if not n.endswith("inv_freq")}


@pytest.mark.parametrize("name", ["dense_a", "dense_b", "moe_a", "moe_b"])
def test_expected_weights_equal_hf_parameters(tiny, name):
    ckpt = tiny(name)
    hf = _hf_param_shapes(ckpt.hf_model)
    if ckpt.config.tie_word_embeddings:
        hf.pop("lm_head.weight", None)
    assert expected_weights(ckpt.config) == hf


def test_per_expert_checkpoint_tensors_are_fused_like_hf(tiny):
    ckpt = tiny("moe_a")
    assert any(".mlp.experts.0.gate_proj.weight" in n for n in ckpt.tensors)  # what save_pretrained wrote
    collected = collect_weights(ckpt.tensors, ckpt.tensors.__getitem__, ckpt.config)
    hf = ckpt.hf_model.state_dict()
    for n in ("model.layers.3.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"):
        assert torch.equal(collected[n], hf[n])


def test_dense_tensors_pass_through_without_copy(tiny):
    ckpt = tiny("dense_a")
    collected = collect_weights(ckpt.tensors, ckpt.tensors.__getitem__, ckpt.config)
    assert all(collected[n] is ckpt.tensors[n] for n in collected)


def test_language_model_prefix_and_vision_tower_are_normalised(tiny):
    ckpt = tiny("dense_a")
    multimodal = {
        normalize_name(n).replace("model.", "model.language_model.", 1): t for n, t in ckpt.tensors.items()
    }
    multimodal["model.visual.blocks.0.attn.qkv.weight"] = torch.zeros(3, 3)
    assert (
        normalize_name("model.language_model.layers.0.mlp.up_proj.weight")
        == "model.layers.0.mlp.up_proj.weight"
    )
    collected = collect_weights(multimodal, multimodal.__getitem__, ckpt.config)
    assert set(collected) == set(expected_weights(ckpt.config))


def test_mtp_weights_loaded_only_when_asked(tiny):
    ckpt = tiny("dense_a")
    mtp = {n: torch.zeros(s) for n, s in expected_mtp_weights(ckpt.config).items()}
    source = {**ckpt.tensors, **mtp}
    assert not any(n.startswith("mtp.") for n in collect_weights(source, source.__getitem__, ckpt.config))
    with_mtp = collect_weights(source, source.__getitem__, ckpt.config, with_mtp=True)
    assert {n for n in with_mtp if n.startswith("mtp.")} == set(mtp)
    assert len(mtp) == 15  # as in the real dense checkpoints' index
    with pytest.raises(WeightInventoryError, match=r"15 missing: mtp\.pre_fc_norm_embedding\.weight"):
        collect_weights(ckpt.tensors, ckpt.tensors.__getitem__, ckpt.config, with_mtp=True)


def test_missing_unexpected_and_wrong_shape_are_all_listed(tiny):
    ckpt = tiny("dense_a")
    broken = dict(ckpt.tensors)
    del broken["model.layers.3.self_attn.k_norm.weight"]
    broken["model.layers.0.linear_attn.bogus"] = torch.zeros(1)
    broken["model.layers.1.linear_attn.A_log"] = torch.zeros(5)
    with pytest.raises(WeightInventoryError) as err:
        collect_weights(broken, broken.__getitem__, ckpt.config)
    text = str(err.value)
    assert "1 missing: model.layers.3.self_attn.k_norm.weight" in text
    assert "1 unexpected: model.layers.0.linear_attn.bogus" in text
    assert "model.layers.1.linear_attn.A_log: (5,) (expected (4,))" in text


def test_incomplete_per_expert_group_is_refused(tiny):
    ckpt = tiny("moe_a")
    broken = {n: t for n, t in ckpt.tensors.items() if n != "model.layers.2.mlp.experts.4.up_proj.weight"}
    with pytest.raises(WeightInventoryError, match=r"model\.layers\.2\.mlp\.experts: incomplete"):
        collect_weights(broken, broken.__getitem__, ckpt.config)
