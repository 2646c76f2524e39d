"""Images: decode (Pillow), resize within the checkpoint's pixel budget to patch multiples, normalise, patchify.

The steps and their order are those of the checkpoint's image processor (``preprocessor_config.json``):

1. decode the bytes with Pillow and convert to RGB, transparency composited onto white; like the
   reference processor, the stored pixels are taken as they are (no EXIF rotation);
2. ``smart_resize``: round height and width to multiples of ``patch_size * merge_size`` (32), then scale both
   (keeping the aspect ratio) so the pixel count lies within ``[min_pixels, max_pixels]``; resize bicubically;
3. scale to [0, 1], normalise by ``image_mean`` / ``image_std`` per channel;
4. patchify into rows of ``C * temporal_patch * patch * patch`` values in merge-block order (the order the
   tower expects; see ``engine.model.vision``), the single frame repeated over the temporal patch.

The result's ``grid_thw`` is ``(1, H / patch, W / patch)`` and its placeholder count ``H * W / (patch *
merge)^2``. Undecodable bytes, a pixel count over ``max_input_pixels`` before resizing, or an aspect ratio
over 200 raise ``MediaError`` (the API answers a 400).
"""

from __future__ import annotations

import hashlib
import io
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

MAX_ASPECT_RATIO = 200


class MediaError(ValueError):
    """A medium that cannot be used: undecodable, too large, or of an unusable shape. ``code``: the API's error
    code (``invalid_media``, ``media_too_large``, ``media_token_budget_exceeded``, ``vision_disabled``, ...)."""

    def __init__(self, message: str, code: str = "invalid_media") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class ImageProcessorConfig:
    """The checkpoint's ``preprocessor_config.json`` fields the image path uses (defaults: Qwen3.5's)."""

    min_pixels: int = 65536  # 256 patches of 16 x 16
    max_pixels: int = 16777216
    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    max_input_pixels: int = 100_000_000  # decoded size refused beyond this (decompression bombs)

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> ImageProcessorConfig:
        """From ``preprocessor_config.json``: ``size.{shortest,longest}_edge`` (pixel counts) or the older
        ``min_pixels`` / ``max_pixels``, plus the patch sizes and the normalisation."""
        size = config.get("size") or {}
        base = cls()
        return cls(
            min_pixels=int(size.get("shortest_edge", config.get("min_pixels", base.min_pixels))),
            max_pixels=int(size.get("longest_edge", config.get("max_pixels", base.max_pixels))),
            patch_size=int(config.get("patch_size", base.patch_size)),
            temporal_patch_size=int(config.get("temporal_patch_size", base.temporal_patch_size)),
            merge_size=int(config.get("merge_size", base.merge_size)),
            image_mean=_triple(config.get("image_mean", base.image_mean)),
            image_std=_triple(config.get("image_std", base.image_std)),
        )


def _triple(value: Any) -> tuple[float, float, float]:
    values = [float(v) for v in (value if isinstance(value, (list, tuple)) else [value] * 3)]
    if len(values) != 3:
        raise ValueError(f"expected 3 channel values, got {value!r}")
    return values[0], values[1], values[2]


@dataclass(frozen=True)
class PreparedImage:
    pixel_values: torch.Tensor  # [h * w, C * temporal_patch * patch * patch] float32, merge-block order
    grid_thw: tuple[int, int, int]  # (1, h, w) in patches
    num_tokens: int  # placeholder tokens: h * w / merge^2
    sha256: str  # of the encoded bytes as received


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Target (height, width): multiples of ``factor``, pixel count within the budget, aspect kept."""
    if min(height, width) < 1:
        raise MediaError(f"image of {width}x{height} pixels is empty")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise MediaError(f"image of {width}x{height} pixels: aspect ratio over {MAX_ASPECT_RATIO}")
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


def decode_image(data: bytes, config: ImageProcessorConfig) -> Image.Image:
    """Bytes -> an RGB Pillow image; ``MediaError`` for anything Pillow cannot read or an oversized image."""
    try:
        image = Image.open(io.BytesIO(data))
        if image.width * image.height > config.max_input_pixels:
            raise MediaError(
                f"image of {image.width}x{image.height} pixels is over the {config.max_input_pixels} pixel limit",
                code="media_too_large",
            )
        image.load()
    except MediaError:
        raise
    except (
        Exception
    ) as exc:  # Pillow raises several types (UnidentifiedImageError, OSError, DecompressionBomb...)
        raise MediaError(f"cannot decode the image: {exc}") from exc
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, image.convert("RGBA")).convert("RGB")
    return image.convert("RGB")


def patchify(frames: np.ndarray, config: ImageProcessorConfig) -> np.ndarray:
    """[T, C, H, W] float32 (T a multiple of the temporal patch) -> [T/tp * h * w, C * tp * p * p] rows in
    merge-block order, per temporal group."""
    t, c, height, width = frames.shape
    p, m, tp = config.patch_size, config.merge_size, config.temporal_patch_size
    h, w = height // p, width // p
    x = frames.reshape(t // tp, tp, c, h // m, m, p, w // m, m, p)
    # (group, block row, block col, row in block, col in block, C, tp, py, px)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(x).reshape(t // tp * h * w, c * tp * p * p)


def prepare_image(data: bytes, config: ImageProcessorConfig) -> PreparedImage:
    """Encoded image bytes -> the tower's input for it (see the module docstring)."""
    image = decode_image(data, config)
    height, width = smart_resize(
        image.height, image.width, config.factor, config.min_pixels, config.max_pixels
    )
    if (height, width) != (image.height, image.width):
        image = image.resize((width, height), resample=Image.Resampling.BICUBIC)
    pixels = np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / 255.0  # [C, H, W]
    mean = np.asarray(config.image_mean, dtype=np.float32)[:, None, None]
    std = np.asarray(config.image_std, dtype=np.float32)[:, None, None]
    pixels = (pixels - mean) / std
    frames = np.repeat(pixels[None], config.temporal_patch_size, axis=0)
    rows = patchify(frames, config)
    grid = (1, height // config.patch_size, width // config.patch_size)
    return PreparedImage(
        pixel_values=torch.from_numpy(rows),
        grid_thw=grid,
        num_tokens=grid[1] * grid[2] // config.merge_size**2,
        sha256=hashlib.sha256(data).hexdigest(),
    )
