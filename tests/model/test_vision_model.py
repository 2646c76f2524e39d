"""The whole multimodal forward against HF's ``Qwen3_5ForConditionalGeneration`` (float32, CPU): our text
model fed the tower's embeddings spliced at the placeholders and the 3D mrope positions, logits within 1e-4
relative (dense and MoE) for a prompt with one image, two images of different sizes, and a video; then 16 greedy steps
(positions ``index + rope_delta``) each HF's argmax over the full sequence (argmax over the ids below the
media tokens, so a placeholder is never generated).

The splice goes through a test-local wrapper of ``embed_tokens`` (the model alone, no runner; the engine's own
splice through ``ForwardBatch.media_embeds`` is test_vision_engine.py's)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from vision_helpers import ARCHS, IMAGE, TEXT_VOCAB, VIDEO, build_tiny_vl, prompt_ids

from engine.media.positions import mrope_positions, positions_after
from engine.model import allocate_model_cache
from engine.model.vision import splice_media


class _SplicingEmbed(torch.nn.Module):
    def __init__(self, embed: torch.nn.Module, rows: torch.Tensor) -> None:
        super().__init__()
        self.embed, self.rows = embed, rows

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        media = (ids == IMAGE) | (ids == VIDEO)
        return splice_media(self.embed(ids), media, self.rows) if media.any() else self.embed(ids)


@pytest.fixture(scope="module", params=list(ARCHS))
def models(request, tmp_path_factory):
    hf, ours, tower, text_config, _ = build_tiny_vl(request.param, tmp_path_factory.mktemp("tiny_vl"))
    return hf, ours, tower, text_config


_ids = prompt_ids


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
