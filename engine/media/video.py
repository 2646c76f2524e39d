"""Video: decode (PyAV), sample frames at ``VideoConfig.fps`` within a frame budget, resize, normalise, patchify.

1. decode the first video stream with PyAV (``pip install 'ninfer[video]'``), at most ``max_decoded_frames``;
2. sample at ``fps`` frames per second of the stream's timestamps (the nearest decoded frame to each sample
   time), at most ``max_frames`` (then evenly spread over the whole video), at least ``temporal_patch_size``;
   the count is rounded up to a multiple of the temporal patch by repeating the last frame;
3. every frame resized (bicubic) to one ``smart_resize`` size within ``max_frame_pixels``, normalised and
   patchified as images are (``image.patchify``): grid ``(frames / temporal_patch, H / patch, W / patch)``;
4. each frame group's timestamp (the mean of its frames' times) goes into the prompt as ``<t seconds>``.

Undecodable bytes, a file without a video stream or a frame over ``max_input_pixels`` raise ``MediaError``.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from engine.media.image import ImageProcessorConfig, MediaError, patchify, smart_resize
from engine.media.prompt import MediaItem, media_sha256


@dataclass(frozen=True)
class VideoConfig:
    fps: float = 2.0
    max_frames: int = 32
    max_frame_pixels: int = 448 * 448
    max_decoded_frames: int = 4096


@dataclass(frozen=True)
class PreparedVideo:
    item: MediaItem
    timestamps: tuple[float, ...]  # per frame group (temporal patch), seconds


def decode_frames(data: bytes, config: VideoConfig, max_pixels: int) -> tuple[list[Image.Image], list[float]]:
    try:
        import av
    except ImportError:
        raise MediaError("video input needs PyAV on the server (pip install 'ninfer[video]')") from None
    frames: list[Image.Image] = []
    times: list[float] = []
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.video:
                raise MediaError("the file has no video stream")
            stream = container.streams.video[0]
            for frame in container.decode(stream):
                if frame.width * frame.height > max_pixels:
                    raise MediaError(f"video frames of {frame.width}x{frame.height} pixels are over the limit",
                                     code="media_too_large")  # fmt: skip
                frames.append(frame.to_image())
                times.append(float(frame.time) if frame.time is not None else len(times) / config.fps)
                if len(frames) >= config.max_decoded_frames:
                    break
    except MediaError:
        raise
    except Exception as exc:  # PyAV raises its own error types (InvalidDataError, ...)
        raise MediaError(f"cannot decode the video: {exc}") from exc
    if not frames:
        raise MediaError("the video has no frames")
    return frames, times


def sample_indices(times: list[float], fps: float, max_frames: int, min_frames: int) -> list[int]:
    """Decoded-frame indices to keep: one per ``1 / fps`` seconds, at most ``max_frames``."""
    start, end = times[0], times[-1]
    count = max(min_frames, min(max_frames, int((end - start) * fps) + 1))
    targets = np.linspace(start, end, count) if count > 1 else np.array([start])
    stamps = np.asarray(times)
    return [int(np.abs(stamps - t).argmin()) for t in targets]


def prepare_video(
    data: bytes, processor: ImageProcessorConfig, config: VideoConfig | None = None
) -> PreparedVideo:
    config = config or VideoConfig()
    frames, times = decode_frames(data, config, processor.max_input_pixels)
    tp = processor.temporal_patch_size
    keep = sample_indices(times, config.fps, config.max_frames, tp)
    keep += [keep[-1]] * (-len(keep) % tp)
    first = frames[keep[0]]
    max_pixels = min(processor.max_pixels, config.max_frame_pixels)
    height, width = smart_resize(
        first.height, first.width, processor.factor, processor.min_pixels, max_pixels
    )
    mean = np.asarray(processor.image_mean, dtype=np.float32)[:, None, None]
    std = np.asarray(processor.image_std, dtype=np.float32)[:, None, None]
    stack = []
    for i in keep:
        image = frames[i].convert("RGB").resize((width, height), resample=Image.Resampling.BICUBIC)
        stack.append((np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / 255.0 - mean) / std)
    rows = patchify(np.stack(stack), processor)
    grid = (len(keep) // tp, height // processor.patch_size, width // processor.patch_size)
    stamps = tuple(float(np.mean([times[i] for i in keep[g * tp : (g + 1) * tp]])) for g in range(grid[0]))
    sha = media_sha256(data, "video", config.fps, config.max_frames, config.max_frame_pixels)
    item = MediaItem("video", torch.from_numpy(rows), grid, grid[0] * grid[1] * grid[2] // processor.merge_size**2,
                     sha)  # fmt: skip
    return PreparedVideo(item, stamps)
