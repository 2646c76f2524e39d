"""load_model from a real `.ninfer` container: zero-copy parameters (but the fused input projections), same
logits, MTP only when asked."""

from __future__ import annotations

import json

import pytest
import torch

from engine.artifact.container import read_artifact, write_artifact
from engine.model import allocate_model_cache, load_model
from engine.model.weights import expected_mtp_weights


@pytest.fixture
def artifact_path(tiny, tmp_path):
    ckpt = tiny("dense_b")
    mtp = {n: torch.randn(s) * 0.05 for n, s in expected_mtp_weights(ckpt.config).items()}
    # The multimodal checkpoints' naming, to exercise normalisation through the real reader.
    tensors = [(n.replace("model.", "model.language_model.", 1), t) for n, t in ckpt.tensors.items()]
    path = tmp_path / "tiny.ninfer"
    write_artifact(path, model_id="ninfer-tiny-dense", weights_id="fp32", tensors=tensors + sorted(mtp.items()),
                   resources=[("config.json", json.dumps(ckpt.hf_config).encode())])  # fmt: skip
    return ckpt, path


def test_load_model_assigns_mmap_views_and_matches_direct_build(artifact_path, paged):
    Driver, Lane = paged
    ckpt, path = artifact_path
    artifact = read_artifact(path, check_registry=False)
    model = load_model(artifact, device="cpu", dtype=torch.float32)
    attn = model.model.layers[2].self_attn
    name = "model.language_model.layers.2.self_attn.o_proj.weight"
    assert attn.o_proj.weight.data_ptr() == artifact.tensor(name).data_ptr()
    # the fused input projections are the one copy: the checkpoint's q, k, v rows, concatenated
    parts = [artifact.tensor(name.replace("o_proj", proj)) for proj in ("q_proj", "k_proj", "v_proj")]
    assert torch.equal(attn.qkv_proj.weight, torch.cat(parts))
    assert model.mtp is None
    cache = allocate_model_cache(
        ckpt.config, num_pages=2, page_size=64, num_state_slots=1, dtype=torch.float32
    )
    batch = Driver(cache).batch([Lane(slot=0)], [list(range(40))])
    got = model.compute_logits(model(batch, cache))
    reference = ckpt.build()
    cache2 = allocate_model_cache(
        ckpt.config, num_pages=2, page_size=64, num_state_slots=1, dtype=torch.float32
    )
    assert torch.equal(got, reference.compute_logits(reference(batch, cache2)))


def test_load_model_with_mtp_and_dtype_cast(artifact_path):
    _, path = artifact_path
    model = load_model(read_artifact(path, check_registry=False), dtype=torch.bfloat16, with_mtp=True)
    assert model.mtp is not None
    assert model.mtp.fc.weight.dtype == torch.bfloat16 and model.lm_head.weight.dtype == torch.bfloat16
    assert not any(p.requires_grad for p in model.parameters())
