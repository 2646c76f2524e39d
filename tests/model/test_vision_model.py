"""The whole multimodal forward against HF's ``Qwen3_5ForConditionalGeneration`` (float32, CPU): our text
model fed the tower's embeddings spliced at the placeholders and the 3D mrope positions, logits within 1e-4
relative (dense and MoE) for a prompt with one image, two images of different sizes, and a video; then 16 greedy steps
(positions ``index + rope_delta``) each HF's argmax over the full sequence (argmax over the ids below the
media tokens, so a placeholder is never generated).

The splice goes through a test-local wrapper of ``embed_tokens`` (the runner's splice is not wired yet)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import (
    Qwen3_5Config,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeConfig,
    Qwen3_5MoeForConditionalGeneration,
)

from engine.model import ModelConfig, allocate_model_cache, build_model, collect_weights
from engine.model.vision import VisionConfig, build_vision_tower, splice_media
from engine.model.vision_positions import mrope_positions, positions_after

IMAGE, VIDEO, START, END = 190, 191, 192, 193
TEXT_VOCAB = 180  # greedy picks among the ids below the media tokens (a placeholder is never generated)
TEXT = dict(
    vocab_size=200, hidden_size=48, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
    num_key_value_heads=1, head_dim=32, linear_num_key_heads=1, linear_num_value_heads=2,
    linear_key_head_dim=16, linear_value_head_dim=16,
    rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.75,
                     "mrope_section": [4, 4, 4], "mrope_interleaved": True},
)  # fmt: skip
MOE_TEXT = {
    **{k: v for k, v in TEXT.items() if k != "intermediate_size"},
    "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 24, "shared_expert_intermediate_size": 32,
}  # fmt: skip
ARCHS = {
    "dense": (Qwen3_5Config, Qwen3_5ForConditionalGeneration, TEXT),
    "moe": (Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration, MOE_TEXT),
}
VISION = dict(
    depth=2, hidden_size=40, intermediate_size=56, num_heads=2, patch_size=4, temporal_patch_size=2,
    spatial_merge_size=2, out_hidden_size=48, num_position_embeddings=36,
)  # fmt: skip


class _SplicingEmbed(torch.nn.Module):
    def __init__(self, embed: torch.nn.Module, rows: torch.Tensor) -> None:
        super().__init__()
        self.embed, self.rows = embed, rows

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        media = (ids == IMAGE) | (ids == VIDEO)
        return splice_media(self.embed(ids), media, self.rows) if media.any() else self.embed(ids)


@pytest.fixture(scope="module", params=list(ARCHS))
def models(request, tmp_path_factory):
    config_cls, model_cls, text = ARCHS[request.param]
    config = config_cls(
        text_config=text, vision_config=VISION, image_token_id=IMAGE, video_token_id=VIDEO,
        vision_start_token_id=START, vision_end_token_id=END,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = model_cls(config).float().eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=gen) * 2.5 - 1.0)
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif "norm" in name and "visual" in name:
                p.copy_(1 + torch.randn(p.shape, generator=gen) * 0.1)
            elif "norm" in name:
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5 if "linear_attn" in name else
                        torch.randn(p.shape, generator=gen) * 0.3)  # fmt: skip
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if "visual" in name else 0.08))
    path = tmp_path_factory.mktemp("tiny_vl")
    hf.save_pretrained(path)
    raw = json.loads((path / "config.json").read_text())
    tensors = {}
    for file in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(file))
    text_config = ModelConfig.from_hf(raw)
    ours = build_model(text_config, collect_weights(tensors, tensors.__getitem__, text_config, False))
    tower = build_vision_tower(VisionConfig.from_hf(raw), list(tensors), tensors.__getitem__, torch.float32)
    return hf, ours, tower, text_config


def _ids(pieces: list[tuple[str, int]], seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    ids: list[int] = []
    for kind, n in pieces:
        if kind == "text":
            ids += torch.randint(0, TEXT_VOCAB, (n,), generator=gen).tolist()
        else:
            ids += [START] + [IMAGE if kind == "image" else VIDEO] * n + [END]
    return ids


CASES = {
    "one_image": ([("text", 7), ("image", 12), ("text", 9)], [[1, 6, 8]], None),
    "two_images": ([("text", 4), ("image", 10), ("text", 3), ("image", 6), ("text", 5)], [[1, 10, 4], [1, 4, 6]],
                   None),
    "video": ([("text", 3), ("video", 6), ("text", 2), ("video", 6), ("text", 2), ("video", 6), ("text", 4)], None,
              [[3, 4, 6]]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_greedy_match_hf(models, paged, case):
    hf, ours, tower, text_config = models
    Driver, Lane = paged
    pieces, images, videos = CASES[case]
    ids = _ids(pieces, seed=len(case))
    grids = torch.tensor((images or []) + (videos or []))
    pixels = torch.randn(
        int(grids.prod(-1).sum()), tower.config.patch_dim, generator=torch.Generator().manual_seed(9)
    )
    n_image = sum(t * h * w for t, h, w in images or [])
    rows = tower(pixels, grids)
    positions, delta = mrope_positions(ids, images, videos, image_token_id=IMAGE, video_token_id=VIDEO,
                                       spatial_merge_size=2)  # fmt: skip

    cache = allocate_model_cache(
        text_config, num_pages=4, page_size=32, num_state_slots=1, dtype=torch.float32
    )
    driver, lane = Driver(cache), Lane(slot=0)
    original = ours.model.embed_tokens
    ours.model.embed_tokens = _SplicingEmbed(original, rows)
    try:
        batch = dataclasses.replace(driver.batch([lane], [ids]), positions=positions)
        logits = ours.compute_logits(ours(batch, cache))
    finally:
        ours.model.embed_tokens = original
    tokens = [int(logits[-1, :TEXT_VOCAB].argmax())]
    for _ in range(15):
        batch = driver.batch([lane], [[tokens[-1]]])
        batch = dataclasses.replace(batch, positions=positions_after(lane.num_cached - 1, 1, delta))
        tokens.append(int(ours.compute_logits(ours(batch, cache))[-1, :TEXT_VOCAB].argmax()))

    full = torch.tensor([ids + tokens[:-1]])
    types = torch.zeros_like(full)
    types[full == IMAGE], types[full == VIDEO] = 1, 2
    kwargs = {"mm_token_type_ids": types}
    if images:
        kwargs.update(pixel_values=pixels[:n_image], image_grid_thw=torch.tensor(images))
    if videos:
        kwargs.update(pixel_values_videos=pixels[n_image:], video_grid_thw=torch.tensor(videos))
    expected = hf(full, **kwargs).logits[0]
    prompt_expected = expected[: len(ids)]
    rel = ((logits - prompt_expected).abs().max() / prompt_expected.abs().max()).item()
    assert rel < 1e-4, f"{case}: prompt logits max relative error {rel:.2e}"
    assert tokens == expected[len(ids) - 1 :, :TEXT_VOCAB].argmax(-1).tolist()
