"""Image preprocessing (engine.media) against HF transformers' Qwen2-VL Pillow image processor (the one
Qwen3.5 checkpoints name), on the same encoded images: equal grids and pixel_values within 1e-5."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from engine.media import ImageProcessorConfig, MediaError, prepare_image, smart_resize

PREPROCESSOR = {
    "size": {"shortest_edge": 32 * 32 * 4, "longest_edge": 32 * 32 * 24},
    "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
}  # fmt: skip
CONFIG = ImageProcessorConfig.from_hf(PREPROCESSOR)


def _encoded(width: int, height: int, mode: str = "RGB", fmt: str = "PNG", seed: int = 0) -> bytes:
    channels = len(mode)
    rng = np.random.default_rng(seed)
    # smooth gradients plus noise, so resampling differences would show
    yy, xx = np.mgrid[0:height, 0:width]
    base = (xx * 255 / max(width - 1, 1) + yy * 128 / max(height - 1, 1)) % 256
    pixels = (base[..., None] + rng.integers(0, 60, (height, width, channels))).clip(0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels if channels > 1 else pixels[..., 0], mode=mode).save(buffer, format=fmt)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def hf_processor() -> Qwen2VLImageProcessorPil:
    return Qwen2VLImageProcessorPil(**PREPROCESSOR)


IMAGES = {
    "exact_multiples": (96, 64, "RGB", "PNG"),
    "upscaled_to_min_pixels": (40, 30, "RGB", "PNG"),
    "downscaled_to_max_pixels": (400, 250, "RGB", "JPEG"),
    "rounded_odd_size": (123, 77, "RGB", "PNG"),
    "rgba_composited_on_white": (70, 90, "RGBA", "PNG"),
    "grayscale": (64, 100, "L", "PNG"),
}


@pytest.mark.parametrize("case", list(IMAGES))
def test_image_matches_hf_processor(hf_processor, case):
    width, height, mode, fmt = IMAGES[case]
    data = _encoded(width, height, mode, fmt, seed=width)
    ours = prepare_image(data, CONFIG)
    expected = hf_processor(images=[Image.open(io.BytesIO(data))], return_tensors="pt")
    assert list(ours.grid_thw) == expected["image_grid_thw"][0].tolist()
    assert ours.num_tokens == ours.grid_thw[1] * ours.grid_thw[2] // 4
    assert ours.pixel_values.shape == expected["pixel_values"].shape
    torch.testing.assert_close(ours.pixel_values, expected["pixel_values"].float(), rtol=0, atol=1e-5)


def test_two_images_concatenate_as_hf_batches_them(hf_processor):
    a, b = _encoded(96, 64, seed=1), _encoded(50, 140, seed=2)
    expected = hf_processor(
        images=[Image.open(io.BytesIO(a)), Image.open(io.BytesIO(b))], return_tensors="pt"
    )
    ours = [prepare_image(a, CONFIG), prepare_image(b, CONFIG)]
    torch.testing.assert_close(torch.cat([o.pixel_values for o in ours]), expected["pixel_values"].float(),
                               rtol=0, atol=1e-5)  # fmt: skip
    assert [list(o.grid_thw) for o in ours] == expected["image_grid_thw"].tolist()


def test_sha256_identifies_the_bytes():
    a, b = _encoded(64, 64, seed=1), _encoded(64, 64, seed=2)
    assert prepare_image(a, CONFIG).sha256 == prepare_image(a, CONFIG).sha256
    assert prepare_image(a, CONFIG).sha256 != prepare_image(b, CONFIG).sha256


def test_config_defaults_and_legacy_pixel_keys():
    assert CONFIG.min_pixels == 4096 and CONFIG.max_pixels == 24576 and CONFIG.factor == 32
    legacy = ImageProcessorConfig.from_hf({"min_pixels": 1000, "max_pixels": 5000, "image_mean": 0.25})
    assert (legacy.min_pixels, legacy.max_pixels, legacy.image_mean) == (1000, 5000, (0.25, 0.25, 0.25))


@pytest.mark.parametrize("height, width", [(1000, 1000), (17, 3000), (5000, 40)])
def test_smart_resize_keeps_the_budget_and_the_multiples(height, width):
    h, w = smart_resize(height, width, 32, 4096, 24576)
    assert h % 32 == 0 and w % 32 == 0
    assert 4096 <= h * w <= 24576 or min(h, w) == 32


def test_undecodable_bytes_are_a_media_error():
    with pytest.raises(MediaError, match="cannot decode"):
        prepare_image(b"not an image at all", CONFIG)


def test_oversized_image_is_refused_before_decoding():
    small_limit = ImageProcessorConfig(max_input_pixels=100 * 100)
    with pytest.raises(MediaError, match="pixel limit"):
        prepare_image(_encoded(200, 120), small_limit)


def test_extreme_aspect_ratio_is_refused():
    with pytest.raises(MediaError, match="aspect ratio"):
        prepare_image(_encoded(1000, 4), CONFIG)
