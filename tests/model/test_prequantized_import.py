"""`convert --weights-id nvfp4` from pre-quantized NVFP4 checkpoints (ModelOpt and compressed-tensors layouts).

The tiny ``dense_q`` model's linears are quantized by our NVFP4 encoder (the fused groups a ModelOpt export
calibrates together share one global scale), written in each exporter's tensor names and conventions, and
converted. The words must arrive unchanged: each NVFP4 object decodes exactly to the row concatenation of its
children's represented weights (``decode_ref`` of the encoder's own words is the reference, so the exporter
conventions are checked independently of the importer's own dequantizer), the input calibration becomes the
site's input divisor, and the engine runs the artifact to within 1e-4 of HF holding the same weights.

NOTE: no real ModelOpt or compressed-tensors export can be made here (their toolkits quantize on a GPU and no
checkpoint can be downloaded); the layouts written below follow the exporters' documented tensor names.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from test_quantized_profiles import _dequantized_reference, _logits

from engine.artifact.cli import main as artifact_cli
from engine.artifact.container import ArtifactError, read_artifact
from engine.artifact.convert import convert
from engine.artifact.profiles import TensorSpec, profile_for
from engine.artifact.profiles.hf_source import source_tensor
from engine.model import load_model
from engine.model.weights import normalize_name
from kernels.quant import decode_ref
from kernels.quant.codec import pack_nvfp4, quantize_nvfp4
from kernels.quant.formats import NVFP4

# linears that a fused parent reads together (one global scale when calibrated jointly)
_GROUPS = (
    r"self_attn\.(q|k|v)_proj", r"linear_attn\.in_proj_(qkv|z)", r"linear_attn\.in_proj_(a|b)",
    r"mlp\.(gate|up)_proj",
)  # fmt: skip


def _group_key(name: str) -> str:
    for pattern in _GROUPS:
        match = re.search(pattern, name)
        if match:
            return name[: match.start()] + pattern
    return name


def _quantized_linears(tensors: dict[str, torch.Tensor]) -> list[str]:
    return [
        n for n, t in tensors.items()
        if n.endswith(".weight") and t.dim() == 2 and t.shape[1] % 16 == 0 and "embed" not in n
        and "lm_head" not in n
    ]  # fmt: skip


def _encode(
    tensors: dict[str, torch.Tensor], shared: bool
) -> dict[str, tuple[torch.Tensor, torch.Tensor, float]]:
    """name -> (packed codes, scale words, divisor): our encoder, over each fused group jointly when ``shared``."""
    names = _quantized_linears(tensors)
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(_group_key(name) if shared else name, []).append(name)
    words = {}
    for members in groups.values():
        joint = torch.cat([tensors[n].float() for n in members])
        pad = (-joint.shape[0]) % 128  # the encoder takes whole 128-row tiles; zero rows change no amax
        codes, scales, divisor = quantize_nvfp4(torch.cat([joint, joint.new_zeros(pad, joint.shape[1])]))
        start = 0
        for n in members:
            rows = tensors[n].shape[0]
            words[n] = (codes[start : start + rows], scales[start : start + rows], divisor)
            start += rows
    return words


def _write(
    ckpt, out: Path, scheme: str, shared: bool
) -> tuple[Path, dict[str, torch.Tensor], dict[str, float]]:
    """The checkpoint in ``scheme``'s layout; returns the dir, each linear's represented weight (decode_ref of
    our encoder's words) and each linear's calibrated input amax."""
    out.mkdir()
    words = _encode(ckpt.tensors, shared)
    tensors: dict[str, torch.Tensor] = {}
    represented: dict[str, torch.Tensor] = {}
    input_amax: dict[str, float] = {}
    for i, (name, value) in enumerate(ckpt.tensors.items()):
        if name not in words:
            tensors[name] = value
            continue
        codes, scales, divisor = words[name]
        rows, k = value.shape
        pad = (-rows) % 128  # decode_ref wants whole 128-row tiles; padding rows are dropped after decoding
        padded = pack_nvfp4(
            torch.cat([codes, torch.zeros(pad, k // 2, dtype=torch.uint8)]),
            torch.cat([scales, torch.zeros(pad, k // 16, dtype=torch.uint8)]),
            divisor,
        )
        represented[name] = decode_ref(NVFP4, padded, (rows + pad, k))[:rows]
        amax = 1.0 + 0.25 * (i % 5)
        input_amax[name] = amax
        base = name.removesuffix(".weight")
        e4m3 = scales.view(torch.float8_e4m3fn)
        if scheme == "modelopt":
            tensors |= {
                base + ".weight": codes, base + ".weight_scale": e4m3,
                base + ".weight_scale_2": torch.tensor(1.0 / divisor, dtype=torch.float32),
                base + ".input_scale": torch.tensor(amax / (448 * 6), dtype=torch.float32),
            }  # fmt: skip
        else:
            tensors |= {
                base + ".weight_packed": codes, base + ".weight_scale": e4m3,
                base + ".weight_global_scale": torch.tensor([divisor], dtype=torch.float32),
                base + ".input_global_scale": torch.tensor([448 * 6 / amax], dtype=torch.float32),
            }  # fmt: skip
    save_file(tensors, str(out / "model.safetensors"))
    config = dict(ckpt.hf_config)
    if scheme == "modelopt":
        config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}
    else:
        config["quantization_config"] = {
            "quant_method": "compressed-tensors",
            "format": "nvfp4-pack-quantized",
        }
    (out / "config.json").write_text(json.dumps(config))
    return out, represented, input_amax


@pytest.fixture(scope="module")
def exported(tiny, tmp_path_factory):
    """exported(scheme, shared) -> _write's result, built once per module."""
    built: dict[tuple[str, bool], tuple[Path, dict[str, torch.Tensor], dict[str, float]]] = {}

    def get(scheme: str, shared: bool):
        if (scheme, shared) not in built:
            root = tmp_path_factory.mktemp("prequant")
            built[scheme, shared] = _write(tiny("dense_q"), root / scheme, scheme, shared)
        return built[scheme, shared]

    return get


def _children(spec: TensorSpec, names: list[str], ckpt) -> set[str]:
    """The checkpoint linears among ``names`` whose rows ``spec`` takes (one gather over index-filled stand-ins)."""
    index = {n: float(i + 1) for i, n in enumerate(names)}
    shapes = {normalize_name(n): tuple(t.shape) for n, t in ckpt.tensors.items()}
    taken = source_tensor(spec, lambda m: torch.full(shapes[m], index.get(m, 0.0)), ckpt.config)
    return {names[int(v) - 1] for v in taken.unique().tolist() if v > 0}


def _nvfp4_specs(artifact, ckpt) -> list[TensorSpec]:
    profile = profile_for(artifact.model_id, artifact.weights_id, moe=False)
    return [s for s in profile.objects(ckpt.config) if isinstance(s, TensorSpec)]


@pytest.mark.parametrize("scheme", ["compressed-tensors", "modelopt"])
def test_nvfp4_words_are_copied_and_the_engine_runs_them(tiny, paged, exported, scheme, tmp_path, capsys):
    ckpt = tiny("dense_q")
    src, represented, input_amax = exported(scheme, True)
    out = tmp_path / "out.ninfer"
    argv = ["convert", str(src), str(out), "--model-id", "ninfer-tiny-dense", "--weights-id", "nvfp4"]
    assert artifact_cli(argv) == 0
    note = capsys.readouterr().err
    assert f"{scheme} NVFP4 words copied into" in note and "(0 of them with scale words re-rounded" in note, (
        note
    )
    artifact = read_artifact(out)

    def expected(name: str) -> torch.Tensor:
        return represented[name] if name in represented else ckpt.tensors[name].float()

    copied = 0
    specs = _nvfp4_specs(artifact, ckpt)
    for spec, following in zip(specs, specs[1:] + [None], strict=True):
        if spec.format != NVFP4:
            continue
        got = decode_ref(NVFP4, artifact.raw_bytes(spec.name), spec.shape)
        want = source_tensor(spec, lambda n: expected(n), ckpt.config)
        if scheme == "compressed-tensors":
            assert torch.equal(got, want), spec.name  # the same words: exact
        else:  # ModelOpt stores the reciprocal of the divisor: one float32 rounding
            assert torch.allclose(got, want, rtol=2e-7, atol=0), spec.name
        copied += 1
        assert following is not None and following.name.endswith("/input_scale_divisor")
        children = _children(spec, list(represented), ckpt)
        assert children, spec.name
        divisor = artifact.tensor(following.name).item()
        assert divisor == pytest.approx(448 * 6 / max(input_amax[n] for n in children), rel=1e-6), spec.name
    assert copied >= 3 * ckpt.config.num_hidden_layers // 2

    if scheme == "modelopt":
        return  # the words are checked above; the engine run below is the same for both layouts
    model = load_model(artifact, dtype=torch.float32)
    prompt = torch.randint(0, ckpt.config.vocab_size, (64,), generator=torch.Generator().manual_seed(5))
    logits = _logits(model, prompt, ckpt.config, paged)
    reference = _dequantized_reference(artifact, ckpt)(prompt[None]).logits[0]
    rel = ((logits - reference).abs().max() / reference.abs().max()).item()
    assert rel < 1e-4, f"{scheme}: max relative logit error {rel:.2e}"


def test_children_with_their_own_divisors_share_the_smallest(tiny, exported, tmp_path, capsys):
    """Separately calibrated children: the parent keeps the smallest divisor, the other rows' scales are
    re-rounded to E4M3 (reported), and the parent still represents each child within E4M3's rounding."""
    ckpt = tiny("dense_q")
    src, represented, _ = exported("compressed-tensors", False)
    out = convert(src, tmp_path / "out.ninfer", model_id="ninfer-tiny-dense", weights_id="nvfp4")
    note = capsys.readouterr().err
    match = re.search(r"copied into (\d+) objects \((\d+) of them with scale words re-rounded", note)
    assert match and int(match[2]) > 0, note
    artifact = read_artifact(out)
    for spec in _nvfp4_specs(artifact, ckpt):
        if spec.format == NVFP4:
            got = decode_ref(NVFP4, artifact.raw_bytes(spec.name), spec.shape)
            want = source_tensor(spec, lambda n: represented.get(n, ckpt.tensors[n].float()), ckpt.config)
            err = ((got - want).norm() / want.norm()).item()
            assert err < 0.08, f"{spec.name}: relative error {err:.3f} after sharing one divisor"


def test_unsupported_or_broken_sources_are_refused_by_name(exported, tmp_path):
    import shutil

    src = tmp_path / "mo"
    shutil.copytree(exported("modelopt", True)[0], src)
    with pytest.raises(ArtifactError, match="pre-quantized"):
        convert(src, tmp_path / "a.ninfer", model_id="ninfer-tiny-dense", weights_id="bf16")

    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(ArtifactError, match="not a supported source"):
        convert(src, tmp_path / "b.ninfer", model_id="ninfer-tiny-dense", weights_id="nvfp4")

    src2 = tmp_path / "ct"
    shutil.copytree(exported("compressed-tensors", True)[0], src2)
    from safetensors.torch import load_file

    tensors = load_file(src2 / "model.safetensors")
    victim = next(n for n in tensors if n.endswith(".weight_scale"))
    del tensors[victim]
    save_file(tensors, str(src2 / "model.safetensors"))
    with pytest.raises(ArtifactError, match=re.escape(victim.removesuffix("_scale"))):
        convert(src2, tmp_path / "c.ninfer", model_id="ninfer-tiny-dense", weights_id="nvfp4")
