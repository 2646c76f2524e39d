"""The vision tower and the 3D rotary positions against HF transformers' Qwen3.5 (float32, CPU).

One tiny random ``Qwen3_5ForConditionalGeneration`` (its weights re-drawn at a scale where every block
visibly changes the stream) is the oracle: its ``model.visual`` for the tower's merged embeddings (one image,
two images of different sizes, a video, and an image with a video in one call) and its
``model.get_rope_index`` for the positions and the rope delta.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

from engine.media.positions import mrope_positions, positions_after
from engine.model.vision import (
    VisionConfig,
    VisionTower,
    build_vision_tower,
    segmented_attention,
    splice_media,
)

IMAGE, VIDEO, START, END = 90, 91, 92, 93
TEXT = dict(
    vocab_size=100, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1, head_dim=32, linear_num_key_heads=1, linear_num_value_heads=2,
    linear_key_head_dim=16, linear_value_head_dim=16,
)  # fmt: skip
VISION = dict(
    depth=3, hidden_size=40, intermediate_size=56, num_heads=2, patch_size=4, temporal_patch_size=2,
    spatial_merge_size=2, out_hidden_size=48, num_position_embeddings=36,
)  # fmt: skip


@pytest.fixture(scope="module")
def hf_model() -> Qwen3_5ForConditionalGeneration:
    config = Qwen3_5Config(
        text_config=TEXT, vision_config=VISION, image_token_id=IMAGE, video_token_id=VIDEO,
        vision_start_token_id=START, vision_end_token_id=END,
    )  # fmt: skip
    config.vision_config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = Qwen3_5ForConditionalGeneration(config).float().eval()
    with torch.no_grad():
        for name, param in model.model.visual.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.1)
            elif param.dim() == 1:  # LayerNorm scales
                param.normal_(1, 0.1)
            else:
                fan_in = param[0].numel() if name != "pos_embed.weight" else 1
                param.normal_(0, 1.0 / math.sqrt(fan_in))
    return model


@pytest.fixture(scope="module")
def config(hf_model) -> VisionConfig:
    return VisionConfig.from_hf(hf_model.config.to_dict())


@pytest.fixture(scope="module")
def tower(hf_model, config) -> VisionTower:
    tower = VisionTower(config).eval()
    tower.load_state_dict(hf_model.model.visual.state_dict(), strict=True)
    return tower


def _pixels(config: VisionConfig, grid_thw: list[list[int]], seed: int) -> torch.Tensor:
    n = sum(t * h * w for t, h, w in grid_thw)
    return torch.randn(n, config.patch_dim, generator=torch.Generator().manual_seed(seed))


def test_config_reads_the_checkpoint_geometry(config):
    assert (config.depth, config.hidden_size, config.num_heads, config.head_dim) == (3, 40, 2, 20)
    assert (config.patch_size, config.temporal_patch_size, config.spatial_merge_size) == (4, 2, 2)
    assert (config.position_side, config.out_hidden_size, config.patch_dim) == (6, 48, 96)
    assert (config.image_token_id, config.video_token_id) == (IMAGE, VIDEO)


def test_config_defaults_are_the_27b_tower():
    config = VisionConfig.from_hf({"vision_config": {"out_hidden_size": 5120}})
    assert (config.depth, config.hidden_size, config.num_heads, config.head_dim) == (27, 1152, 16, 72)
    assert (config.patch_size, config.temporal_patch_size, config.position_side) == (16, 2, 48)


def test_config_rejects_a_text_only_checkpoint():
    with pytest.raises(ValueError, match="vision_config"):
        VisionConfig.from_hf({"model_type": "qwen3_5_text"})


CASES = {
    "one_image": [[1, 6, 8]],
    "two_images_of_different_sizes": [[1, 10, 4], [1, 4, 6]],
    "video": [[3, 4, 6]],
    "image_and_video": [[1, 8, 8], [2, 6, 4]],
    "image_larger_than_the_position_table": [[1, 12, 14]],
}


@pytest.mark.parametrize("case", list(CASES))
def test_tower_matches_hf(hf_model, tower, config, case):
    grid = torch.tensor(CASES[case])
    pixels = _pixels(config, CASES[case], seed=len(case))
    with torch.no_grad():
        expected = hf_model.model.visual(pixels, grid_thw=grid).pooler_output
        ours = tower(pixels, grid)
    assert ours.shape == expected.shape == (sum(tower.split_sizes(grid)), config.out_hidden_size)
    rel = ((ours - expected).abs().max() / expected.abs().max()).item()
    assert rel < 1e-4, f"{case}: max relative error {rel:.2e}"


def test_media_do_not_attend_across_each_other(tower, config):
    """Two images in one call give each the embeddings it gets alone (segmented attention)."""
    a, b = [[1, 6, 8]], [[1, 4, 4]]
    pa, pb = _pixels(config, a, 1), _pixels(config, b, 2)
    with torch.no_grad():
        both = tower(torch.cat([pa, pb]), torch.tensor(a + b))
        alone = torch.cat([tower(pa, torch.tensor(a)), tower(pb, torch.tensor(b))])
    torch.testing.assert_close(both, alone, rtol=1e-5, atol=1e-5)


def test_segmented_attention_equals_a_block_diagonal_mask():
    q, k, v = torch.randn(3, 11, 2, 8, generator=torch.Generator().manual_seed(3)).unbind(0)
    lengths = [4, 3, 4]
    seg = torch.repeat_interleave(torch.arange(3), torch.tensor(lengths))
    mask = seg[:, None] == seg[None, :]
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask
    ).transpose(0, 1)
    torch.testing.assert_close(segmented_attention(q, k, v, lengths), expected)


def test_tower_builds_from_the_saved_checkpoint(hf_model, config, tmp_path):
    """``save_pretrained``'s safetensors (names ``model.visual.*``) -> ``build_vision_tower``: the HF output."""
    from safetensors.torch import load_file

    hf_model.save_pretrained(tmp_path)
    tensors = {}
    for path in sorted(tmp_path.glob("*.safetensors")):
        tensors.update(load_file(path))
    assert any(name.startswith("model.visual.blocks.") for name in tensors)
    tower = build_vision_tower(config, list(tensors), tensors.__getitem__, torch.float32)
    grid = [[1, 6, 8]]
    pixels = _pixels(config, grid, 5)
    with torch.no_grad():
        expected = hf_model.model.visual(pixels, grid_thw=torch.tensor(grid)).pooler_output
        torch.testing.assert_close(tower(pixels, torch.tensor(grid)), expected, rtol=1e-4, atol=1e-5)
    del tensors["model.visual.blocks.1.attn.qkv.bias"]
    tensors["model.visual.extra.weight"] = torch.zeros(1)
    tensors["model.visual.merger.linear_fc2.bias"] = torch.zeros(3)
    with pytest.raises(ValueError) as info:
        build_vision_tower(config, list(tensors), tensors.__getitem__, torch.float32)
    message = str(info.value)
    assert "missing blocks.1.attn.qkv.bias" in message
    assert "unexpected model.visual.extra.weight" in message
    assert "merger.linear_fc2.bias: shape (3,), expected (48,)" in message


def test_tower_rejects_pixels_that_do_not_match_the_grid(tower, config):
    with pytest.raises(ValueError, match="grid_thw"):
        tower(_pixels(config, [[1, 4, 4]], 0), torch.tensor([[1, 4, 6]]))


def _prompt(pieces: list[tuple[str, int]]) -> list[int]:
    ids: list[int] = []
    for kind, n in pieces:
        ids += {
            "text": [7] * n,
            "image": [START] + [IMAGE] * n + [END],
            "video": [START] + [VIDEO] * n + [END],
        }[kind]
    return ids


POSITION_CASES = {
    "one_image": (_prompt([("text", 5), ("image", 12), ("text", 4)]), [[1, 6, 8]], None),
    "two_images": (_prompt([("text", 3), ("image", 10), ("text", 2), ("image", 6), ("text", 3)]),
                   [[1, 10, 4], [1, 4, 6]], None),
    "video_frames_between_timestamps": (
        _prompt([("text", 2), ("video", 6), ("text", 3), ("video", 6), ("text", 3), ("video", 6), ("text", 2)]),
        None, [[3, 4, 6]]),
    "image_then_video": (_prompt([("image", 16), ("text", 2), ("video", 6), ("text", 1), ("video", 6)]),
                         [[1, 8, 8]], [[2, 6, 4]]),
    "text_only": (_prompt([("text", 9)]), None, None),
}  # fmt: skip


@pytest.mark.parametrize("case", list(POSITION_CASES))
def test_mrope_positions_match_hf_get_rope_index(hf_model, case):
    ids, images, videos = POSITION_CASES[case]
    input_ids = torch.tensor([ids])
    types = torch.zeros_like(input_ids)
    types[input_ids == IMAGE] = 1
    types[input_ids == VIDEO] = 2
    expected, expected_delta = hf_model.model.get_rope_index(
        input_ids, types,
        image_grid_thw=None if images is None else torch.tensor(images),
        video_grid_thw=None if videos is None else torch.tensor(videos),
    )  # fmt: skip
    positions, delta = mrope_positions(
        ids, images, videos, image_token_id=IMAGE, video_token_id=VIDEO, spatial_merge_size=2
    )
    assert torch.equal(positions, expected[:, 0])
    assert delta == int(expected_delta)


def test_decode_positions_continue_after_the_media():
    ids, images, videos = POSITION_CASES["one_image"]
    positions, delta = mrope_positions(
        ids, images, videos, image_token_id=IMAGE, video_token_id=VIDEO, spatial_merge_size=2
    )
    assert delta == 4 - 12  # 12 placeholders span max(3, 4) = 4 positions
    after = positions_after(len(ids), 3, delta)
    assert after.tolist() == [[int(positions.max()) + 1 + i for i in range(3)]] * 3


@pytest.mark.parametrize(
    "ids, images, match",
    [
        (_prompt([("image", 10)]), [[1, 6, 8]], "has 10 tokens, its grid needs 12"),
        (_prompt([("image", 12)]), None, "more image placeholder runs"),
        (_prompt([("text", 4)]), [[1, 6, 8]], "1 images given but 0"),
        (_prompt([("image", 12)]), [[1, 5, 8]], "multiple of the spatial merge size"),
    ],
)
def test_mrope_positions_reject_mismatched_media(ids, images, match):
    with pytest.raises(ValueError, match=match):
        mrope_positions(ids, images, None, image_token_id=IMAGE, video_token_id=VIDEO, spatial_merge_size=2)


def test_splice_media_replaces_the_placeholder_rows_in_order():
    embeds = torch.zeros(6, 3)
    is_media = torch.tensor([False, True, True, False, True, False])
    rows = torch.arange(9.0).view(3, 3)
    out = splice_media(embeds, is_media, rows)
    assert torch.equal(out[is_media], rows) and torch.equal(out[~is_media], torch.zeros(3, 3))
    with pytest.raises(ValueError, match="3 placeholder tokens but 2 media embeddings"):
        splice_media(embeds, is_media, rows[:2])


@pytest.mark.parametrize("lengths", [[11], [4, 4, 3], [5, 6]])
def test_segmented_attention_paths_agree_with_per_segment_sdpa(lengths):
    """The equal-length reshape path and the grouped gather path both equal SDPA run segment by segment."""
    q, k, v = torch.randn(3, 11, 2, 8, generator=torch.Generator().manual_seed(4)).unbind(0)
    parts = []
    for seg_q, seg_k, seg_v in zip(*(x.split(lengths) for x in (q, k, v)), strict=True):
        o = torch.nn.functional.scaled_dot_product_attention(
            *(x.transpose(0, 1) for x in (seg_q, seg_k, seg_v))
        )
        parts.append(o.transpose(0, 1))
    torch.testing.assert_close(segmented_attention(q, k, v, lengths), torch.cat(parts))
