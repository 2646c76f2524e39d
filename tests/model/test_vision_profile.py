"""The vision tower of a weight profile: a tiny vision-language checkpoint converted to ``groupwise-int`` stores its
tower as the profile's ``vision/*`` objects (Q6 patch embedding, Q4/Q5 block matrices, W8 merger, BF16 biases,
norms and position table), and ``load_vision`` binds them back (CPU, float32).

- the bound tower equals a tower built from the same dequantized weights in the checkpoint's layout (to float
  rounding), and stays within a stated error of the unquantized source tower;
- an engine started with vision on the converted artifact answers image requests with HF ``generate``'s greedy
  tokens on the weights the artifact represents (text and tower dequantized into the HF model);
- a missing or mis-sized tower object is refused by name.
"""

from __future__ import annotations

import copy
import hashlib

import pytest
import torch
from test_quantized_profiles import _rewrite
from test_vision_engine import STEPS, hf_greedy
from vision_helpers import END, IMAGE, START, VIDEO, build_tiny_vl, prompt_ids

from engine.artifact.container import Artifact, ArtifactError, read_artifact
from engine.artifact.convert import convert
from engine.artifact.profiles import PROFILES, TensorSpec, VisionGeometry, profile_for
from engine.artifact.profiles.hf_source import hf_tensors, vision_parameter
from engine.config import EngineConfig
from engine.core import EngineCore, load_artifact
from engine.media import MediaItem, MediaTokens, prompt_media
from engine.model.config import ModelConfig
from engine.model.vision import VISION_PREFIX, VisionConfig, VisionTower, build_vision_tower
from engine.model.vision_load import load_vision
from engine.request import FinishEvent, SamplingParams, TokenEvent
from engine.tokenizer import qwen35_tokenizer
from kernels.quant import decode_ref

TOKENS = MediaTokens(IMAGE, VIDEO, START, END, spatial_merge_size=2)
# relative RMS error of the bound tower's output against the unquantized source tower (Q4/Q5 blocks on random
# weights: chaotic, as the text towers of test_quantized_profiles; measured 0.088 for this checkpoint)
MAX_TOWER_ERROR = 0.25


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("vl_profile")
    hf, _, tower, _, raw = build_tiny_vl("dense", root / "hf")
    path = convert(root / "hf", root / "gw.ninfer", model_id="ninfer-tiny-dense", weights_id="groupwise-int")
    return hf, tower, raw, path


def _values(artifact: Artifact, specs: list[TensorSpec]) -> dict[str, torch.Tensor]:
    return {
        s.name: decode_ref(s.format, artifact.raw_bytes(s.name), s.shape)
        if s.quantized
        else artifact.tensor(s.name).float()
        for s in specs
    }


def _reference_tower(artifact: Artifact, raw: dict):
    """A tower built by the HF-layout loader from the artifact's dequantized vision objects."""
    specs = [e for e in _specs(artifact) if e.name.startswith("vision/")]
    config = VisionConfig.from_hf(raw)
    shapes = VisionTower(config).state_dict()
    tensors = {
        VISION_PREFIX + vision_parameter(n): v.reshape(shapes[vision_parameter(n)].shape)
        for n, v in _values(artifact, specs).items()
    }
    return build_vision_tower(config, list(tensors), tensors.__getitem__, torch.float32)


def _specs(artifact: Artifact) -> list[TensorSpec]:
    raw = artifact.hf_config()  # the stored config (the converter drops the MTP layers the checkpoint lacks)
    text = ModelConfig.from_hf(raw)
    geometry = VisionGeometry.of(VisionConfig.from_hf(raw))
    profile = profile_for(artifact.model_id, artifact.weights_id)
    assert profile is not None
    return [s for s in profile.objects(text, geometry) if isinstance(s, TensorSpec)]


def _pixels(grids, dim, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(sum(t * h * w for t, h, w in grids), dim, generator=gen), torch.tensor(grids)


def test_converted_tower_is_stored_in_the_profile_formats(converted):
    _, _, raw, path = converted
    with Artifact(path) as art:
        stored = {e.name: e.format for e in art.directory.tensors}
        assert (
            VisionConfig.from_hf(art.hf_config()).depth == 2
        )  # the stored config carries the tower's geometry
    expected = {s.name: s.format for s in _specs(read_artifact(path))}
    assert stored == expected
    assert (
        stored["vision/patch_embedding"] == "Q6G64_F16S" and stored["vision/layers/1/mlp/fc2"] == "Q5G64_F16S"
    )
    assert stored["vision/merger/fc1"] == "W8G32_F16S" and stored["vision/position_embedding"] == "BF16"


def test_bound_tower_equals_its_dequantized_weights_and_stays_near_the_source(converted):
    _, source, raw, path = converted
    artifact = read_artifact(path)
    parts = load_vision(artifact, "cpu", torch.float32)
    assert parts.tokens == TOKENS
    reference = _reference_tower(artifact, raw)
    pixels, grid = _pixels([[1, 6, 8], [2, 4, 4]], parts.tower.config.patch_dim)
    out = parts.tower(pixels, grid)
    torch.testing.assert_close(out, reference(pixels, grid), rtol=1e-6, atol=1e-6)
    expected = source(pixels, grid)
    error = ((out - expected).norm() / expected.norm()).item()
    print(f"bound tower vs its unquantized source: relative RMS error {error:.3f}")
    assert 0 < error < MAX_TOWER_ERROR


def _dequantized_hf(hf, artifact: Artifact, raw: dict):
    """The HF vision-language model holding exactly the weights the artifact represents (text and tower)."""
    specs = _specs(artifact)
    values = _values(artifact, [s for s in specs if not s.name.endswith("/input_scale_divisor")])
    model = copy.deepcopy(hf)
    state = model.state_dict()
    text_names = {
        n.replace("model.language_model.", "model.", 1): n for n in state if not n.startswith("model.visual.")
    }
    text_specs = [s for s in specs if not s.name.startswith("vision/")]
    shapes = {short: tuple(state[n].shape) for short, n in text_names.items()}
    rebuilt = {
        text_names[short]: t
        for short, t in hf_tensors(
            values, text_specs, shapes, ModelConfig.from_hf(artifact.hf_config())
        ).items()
    }
    for name, value in values.items():
        if name.startswith("vision/"):
            target = VISION_PREFIX + vision_parameter(name)
            rebuilt[target] = value.reshape(state[target].shape)
    missing = [n for n, t in rebuilt.items() if t.isnan().any()] + sorted(set(state) - set(rebuilt))
    assert not missing, f"no artifact object covers {missing}"
    model.load_state_dict(rebuilt)
    return model


def test_engine_with_vision_on_the_converted_artifact_answers_like_hf_on_its_weights(converted):
    hf, _, raw, path = converted
    loaded = load_artifact(path, device="cpu", dtype=torch.float32, with_vision=True)
    assert loaded.vision is not None
    flags = {"vision": True, "max_context": 256, "prefill_chunk": 8, "prefill_chunk_multiple": 1}
    core = EngineCore(
        loaded.model, qwen35_tokenizer(), EngineConfig.from_flags(**flags), vision=loaded.vision
    )
    ids = prompt_ids([("text", 7), ("image", 12), ("text", 9)], seed=3)
    dim = loaded.vision.tower.config.patch_dim
    pixels, _ = _pixels([[1, 6, 8]], dim, seed=5)
    items = [MediaItem("image", pixels, (1, 6, 8), 12, hashlib.sha256(b"5").hexdigest())]
    params = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True, presence_penalty=0.0)
    assert core.add_request("r", ids, params, media=prompt_media(ids, items, TOKENS)) is None
    tokens, finish = [], None
    while core.has_work():
        for event in core.step():
            if isinstance(event, TokenEvent):
                tokens.extend(event.token_ids)
            elif isinstance(event, FinishEvent):
                finish = event
    assert finish is not None and len(tokens) == STEPS
    assert core.runner.media.num_tower_runs == 1
    assert tokens == hf_greedy(_dequantized_hf(hf, read_artifact(path), raw), ids, items)


def test_a_missing_or_mis_sized_tower_object_is_refused_by_name(converted, tmp_path):
    _, _, _, path = converted
    dropped = "vision/layers/1/mlp/fc1"
    missing = _rewrite(path, tmp_path / "missing.ninfer", lambda n, v: None if n == dropped else (n, v))
    with pytest.raises(ArtifactError, match=f"'{dropped}' missing"):
        load_artifact(missing, device="cpu", dtype=torch.float32, with_vision=True)
    with pytest.raises(ValueError, match=f"'{dropped}' missing"):
        load_vision(read_artifact(missing), "cpu", torch.float32)

    bias = "vision/merger/fc2_bias"
    short = _rewrite(path, tmp_path / "short.ninfer", lambda n, v: (n, v[:-1] if n == bias else v))
    with pytest.raises(ValueError, match=f"'{bias}' is \\[47\\] BF16.* the profile has \\[48\\] BF16"):
        load_vision(read_artifact(short), "cpu", torch.float32)
    with Artifact(path) as art:
        last = max(art.directory.tensors, key=lambda e: e.offset)
    assert last.name.startswith("vision/")  # the tower is stored last: a truncated file loses a tower object
    truncated = tmp_path / "truncated.ninfer"
    truncated.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ArtifactError, match=f"{last.name}.*truncated"):
        read_artifact(truncated)


class _PublishedLayout:
    """What ``load_vision`` reads of a published file before its tower: frontend resources, no config.json."""

    model_id, weights_id = "qwen3.6-27b", "groupwise-int"

    def resource_names(self) -> list[str]:
        return ["frontend/tokenizer.json"]

    def resource(self, name: str) -> bytes:
        from engine.chat.qwen35 import build_qwen35_tokenizer_json

        assert name == "frontend/tokenizer.json"
        return build_qwen35_tokenizer_json()


def test_published_layout_derives_the_family_tower_and_the_tokenizer_media_ids():
    from engine.model.vision_load import _published_config

    profile = PROFILES["qwen3.6-27b/groupwise-int"]
    config = VisionConfig.from_hf(_published_config(_PublishedLayout(), profile))  # type: ignore[arg-type]
    assert (config.depth, config.hidden_size, config.out_hidden_size, config.patch_dim) == (
        27,
        1152,
        5120,
        1536,
    )
    assert (config.image_token_id, config.video_token_id) == (248056, 248057)
    assert (config.vision_start_token_id, config.vision_end_token_id) == (248053, 248054)
    # its geometry is the one the published inventory stores (the default tower of the published plan)
    assert profile.objects(None, VisionGeometry.of(config)) == profile.objects()


@pytest.mark.gpu
def test_bound_tower_on_the_gpu_matches_the_cpu(converted):
    """Decoded on the GPU (``kernels.quant.dequantize`` on the device payload) and run in bf16: the CPU float32
    tower's output within bf16 rounding (relative RMS below 2%)."""
    _, _, _, path = converted
    artifact = read_artifact(path)
    cpu = load_vision(artifact, "cpu", torch.float32).tower
    gpu = load_vision(artifact, "cuda", torch.bfloat16).tower
    assert all(p.device.type == "cuda" and p.dtype == torch.bfloat16 for p in gpu.parameters())
    pixels, grid = _pixels([[1, 6, 8], [2, 4, 4]], cpu.config.patch_dim)
    expected = cpu(pixels, grid)
    out = gpu(pixels.cuda(), grid).float().cpu()
    error = ((out - expected).norm() / expected.norm()).item()
    assert error < 0.02, f"GPU bf16 tower vs CPU float32: relative RMS {error:.4f}"
