"""Tiny models converted to each weight profile by our encoder, loaded by the artifact's identity, run quantized.

For each profile kind: HF checkpoint -> ``ninfer-artifact convert --weights-id KIND`` (our encoder) -> ``load_model``
(the identity picks the profile; quantized layers run ``kernels.quant.quant_linear``, on the CPU its exact
reference). Two comparisons over a 96-token prompt:

- against HF on the *same dequantized weights* (the artifact decoded with ``kernels.quant.decode_ref`` and
  mapped back to the checkpoint's names): max relative logit error below 1e-4, as the fp32 parity tests;
- against the model's own unquantized self (the original HF weights): the quantization error (relative RMS
  of the logits) bounded per profile and greedy (teacher-forced argmax) agreement reported and bounded below.

NOTE: these tiny random models are chaotic, so their quantization error is large and says little about real
checkpoints: on ``dense_a`` rounding every matrix to bf16 alone gives 3.7% RMS logit error (92% argmax
agreement), W8 everywhere 9% (84%), Q6 42% (47%), Q4 96% (9%). The profiles mix Q4/Q5 (groupwise-int), NVFP4
(nvfp4) or NVFP4 + FP8 (nvfp4-mixed) and land where those controls predict; the bounds below are the measured
values with a margin (measured: groupwise-int 0.89 / 12.5%, MoE 0.53 / 32%, nvfp4 0.96 / 10%, nvfp4-mixed
0.77 / 16%). What pins correctness is the first comparison, exact to 1e-4.

And the refusals: an inventory that does not match its profile, a truncated file, by the object's name.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch

from engine.artifact.cli import main as artifact_cli
from engine.artifact.container import (
    Artifact,
    ArtifactError,
    EncodedTensor,
    read_artifact,
    write_artifact,
)
from engine.artifact.profiles import TensorSpec, profile_for
from engine.artifact.profiles.hf_source import hf_tensors
from engine.model import allocate_model_cache, load_model, make_forward_batch
from engine.model.quant import QuantMethod
from kernels.quant import decode_ref

# profile kind -> (tiny checkpoint, max relative RMS logit error vs the unquantized model, min greedy agreement)
CASES = {
    "groupwise-int": ("dense_a", 1.0, 0.06),
    "nvfp4": ("dense_q", 1.1, 0.05),
    "nvfp4-mixed": ("dense_q", 0.9, 0.08),
    "moe-groupwise-int": ("moe_a", 0.65, 0.2),
}


def _convert(ckpt, kind: str, out: Path) -> Path:
    weights_id = kind.removeprefix("moe-")
    model_id = "ninfer-tiny-moe" if ckpt.config.is_moe else "ninfer-tiny-dense"
    argv = ["convert", str(ckpt.path), str(out), "--model-id", model_id, "--weights-id", weights_id]
    assert artifact_cli(argv) == 0
    return out


def _logits(model, prompt, config, paged):
    Driver, Lane = paged
    cache = allocate_model_cache(config, num_pages=4, page_size=64, num_state_slots=1, dtype=torch.float32)
    driver = Driver(cache)
    return model.compute_logits(model(driver.batch([Lane(slot=0)], [prompt.tolist()]), cache))


def _dequantized_reference(artifact: Artifact, ckpt):
    """The HF model holding exactly the weights the artifact represents."""
    profile = profile_for(artifact.model_id, artifact.weights_id, moe=ckpt.config.is_moe)
    config = artifact.hf_config()
    from engine.model.config import ModelConfig

    model_config = ModelConfig.from_hf(config)
    specs = [s for s in profile.objects(model_config) if isinstance(s, TensorSpec)]
    values = {}
    for spec in specs:
        if spec.name.endswith("/input_scale_divisor"):
            continue
        if spec.quantized:
            values[spec.name] = decode_ref(spec.format, artifact.raw_bytes(spec.name), spec.shape)
        else:
            values[spec.name] = artifact.tensor(spec.name).float()
    hf = copy.deepcopy(ckpt.hf_model)
    state = hf.state_dict()
    rebuilt = hf_tensors(values, specs, {n: tuple(t.shape) for n, t in state.items()}, model_config)
    missing = [n for n, t in rebuilt.items() if t.isnan().any()]
    assert not missing, f"no artifact object covers {missing}"
    hf.load_state_dict(rebuilt)
    return hf


@pytest.mark.parametrize("kind", sorted(CASES))
def test_converted_profile_runs_quantized_and_matches_hf_on_its_weights(tiny, paged, kind, tmp_path):
    name, max_error, min_agreement = CASES[kind]
    ckpt = tiny(name)
    path = _convert(ckpt, kind, tmp_path / f"{kind}.ninfer")
    artifact = read_artifact(path)
    model = load_model(artifact, dtype=torch.float32)
    quantized = [m for m in model.modules() if isinstance(getattr(m, "method", None), QuantMethod)]
    assert quantized, "no layer runs a quantized method"
    prompt = torch.randint(0, ckpt.config.vocab_size, (96,), generator=torch.Generator().manual_seed(3))
    logits = _logits(model, prompt, ckpt.config, paged)

    expected = _dequantized_reference(artifact, ckpt)(prompt[None]).logits[0]
    rel = ((logits - expected).abs().max() / expected.abs().max()).item()
    assert rel < 1e-4, f"{kind}: vs HF on the dequantized weights, max relative logit error {rel:.2e}"

    unquantized = ckpt.hf_model(prompt[None]).logits[0]
    error = ((logits - unquantized).norm() / unquantized.norm()).item()
    agreement = (logits.argmax(-1) == unquantized.argmax(-1)).float().mean().item()
    print(
        f"{kind}: vs its unquantized self: relative RMS logit error {error:.3f}, greedy agreement {agreement:.1%}"
    )
    assert error < max_error, f"{kind}: quantization error {error:.3f} above the stated {max_error}"
    assert agreement >= min_agreement, f"{kind}: greedy agreement {agreement:.1%} below {min_agreement:.0%}"


def _rewrite(src: Path, dst: Path, edit) -> Path:
    """Copy an artifact object by object, ``edit(name, value)`` -> (name, value) or None to drop it."""
    with Artifact(src) as art:
        tensors = []
        for entry in art.directory.tensors:
            value = (
                EncodedTensor(entry.shape, entry.format, entry.layout, bytes(art.raw_bytes(entry.name)))
                if entry.layout != "contiguous-le-v1"
                else art.tensor(entry.name).clone()
            )
            edited = edit(entry.name, value)
            if edited is not None:
                tensors.append(edited)
        resources = [(n, art.resource(n)) for n in art.resource_names()]
        model_id, weights_id = art.model_id, art.weights_id
    return write_artifact(dst, model_id=model_id, weights_id=weights_id, tensors=tensors, resources=resources)


def test_load_refuses_an_inventory_that_does_not_match_its_profile(tiny, tmp_path):
    path = _convert(tiny("dense_a"), "groupwise-int", tmp_path / "gw.ninfer")
    dropped = "text/layers/3/attention/gate_value"
    broken = _rewrite(path, tmp_path / "missing.ninfer", lambda n, v: None if n == dropped else (n, v))
    with pytest.raises(ArtifactError, match=f"'{dropped}' missing"):
        load_model(read_artifact(broken))

    def requantize(name, value):  # the MLP gate_up stored Q5 where the profile says Q4
        if name != "text/layers/0/mlp/gate_up":
            return name, value
        from kernels.quant import encode

        weight = decode_ref(value.format, value.data, value.shape)
        return name, EncodedTensor(
            value.shape, "Q5G64_F16S", value.layout, encode("Q5G64_F16S", weight).numpy().tobytes()
        )

    wrong = _rewrite(path, tmp_path / "wrong.ninfer", requantize)
    with pytest.raises(
        ArtifactError, match="'text/layers/0/mlp/gate_up' is .* Q5G64_F16S.* the profile has .* Q4G64_F16S"
    ):
        load_model(read_artifact(wrong))


def test_a_truncated_quantized_file_is_refused_by_name(tiny, tmp_path):
    path = _convert(tiny("dense_a"), "groupwise-int", tmp_path / "gw.ninfer")
    with Artifact(path) as art:
        last = max(art.directory.tensors, key=lambda e: e.offset)
    os.truncate(path, path.stat().st_size - 100)
    with pytest.raises(ArtifactError, match=f"{last.name}.*truncated"):
        read_artifact(path)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["groupwise-int", "nvfp4", "nvfp4-mixed"])
def test_quantized_model_on_the_gpu_matches_the_cpu_reference(tiny, kind, tmp_path):
    """The Triton quant_linear kernels (GEMM for the 96-token prompt, GEMV for a decode step) in the loaded
    model agree with the CPU reference path (kernels.quant.quant_linear_ref) within bf16 rounding."""
    ckpt = tiny("dense_q")
    path = _convert(ckpt, kind, tmp_path / f"{kind}.ninfer")
    cpu = load_model(read_artifact(path), dtype=torch.float32)
    gpu = load_model(read_artifact(path), device="cuda", dtype=torch.bfloat16)
    prompt = torch.randint(0, ckpt.config.vocab_size, (96,), generator=torch.Generator().manual_seed(3))
    results = []
    for model, device, dtype in ((cpu, "cpu", torch.float32), (gpu, "cuda", torch.bfloat16)):
        cache = allocate_model_cache(
            ckpt.config, num_pages=4, page_size=64, num_state_slots=1, dtype=dtype, device=device
        )
        batch = make_forward_batch([prompt.tolist()], [0], [[0, 1]], [0], 64, device=device)
        first = model.compute_logits(model(batch, cache), batch.last_token_indices()).float().cpu()
        step = make_forward_batch([[int(first.argmax())]], [96], [[0, 1]], [0], 64, device=device)
        results.append(torch.cat([first, model.compute_logits(model(step, cache)).float().cpu()]))
    rel = ((results[1] - results[0]).norm() / results[0].norm()).item()
    assert rel < 3e-2, f"{kind}: GPU vs CPU reference relative RMS logit error {rel:.2e}"
