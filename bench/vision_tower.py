"""The Qwen3.5 vision tower at the 27B geometry (random weights, bf16): images per second and latency.

Run on a CUDA machine from the repository root:

    python3 bench/vision_tower.py --json bench/results/vision_tower_h200_DATE.json

Geometry: 27 blocks, width 1152, 16 heads x 72, patch 16, merge 2, out 5120 (the 27B text width). Sizes:
one 1024x1024 image (64 x 64 patches -> 1024 tokens) per call, batches of 1/4/8 such images, a 448x448 one,
and an 8-frame 448x448 video (4 temporal groups). Each timing is the median of CUDA-event timed calls after
warm-up, pixels already on the device (preprocessing is not included).

Then (unless ``--no-ttft``) the time to first token through the engine (EngineCore on the synthetic 27B model,
random bf16 weights, ``--vision`` with this tower): a request with one 1024x1024 image (1024 placeholder tokens
plus text) against a text-only request of the same token count, each the median of ``--ttft-iters`` cold runs
(prefix reuse off). The difference is the tower plus the splice; preprocessing (Pillow) is measured apart.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
from pathlib import Path

import torch

from engine.model.vision import VisionConfig, VisionTower

CASES = {  # name -> list of grid_thw rows
    "1x1024px": [[1, 64, 64]],
    "4x1024px": [[1, 64, 64]] * 4,
    "8x1024px": [[1, 64, 64]] * 8,
    "1x448px": [[1, 28, 28]],
    "video_8frames_448px": [[4, 28, 28]],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--ttft-iters", type=int, default=5)
    parser.add_argument("--no-ttft", action="store_true")
    args = parser.parse_args()
    config = VisionConfig.from_hf({"vision_config": {"out_hidden_size": 5120}})
    torch.manual_seed(0)
    tower = VisionTower(config)
    for p in tower.parameters():
        p.data.normal_(0, 0.02)
    tower = tower.to("cuda", torch.bfloat16).eval()
    results = {}
    for name, grids in CASES.items():
        grid = torch.tensor(grids)
        pixels = torch.randn(int(grid.prod(-1).sum()), config.patch_dim, device="cuda", dtype=torch.bfloat16)
        times = []
        with torch.inference_mode():
            for i in range(args.iters + 3):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                out = tower(pixels, grid)
                end.record()
                torch.cuda.synchronize()
                if i >= 3:
                    times.append(start.elapsed_time(end) / 1000)
        median = statistics.median(times)
        results[name] = {
            "grid_thw": grids, "patches": pixels.shape[0], "tokens": out.shape[0],
            "median_s": median, "media_per_s": len(grids) / median, "patches_per_s": pixels.shape[0] / median,
        }  # fmt: skip
        print(
            f"{name:>22}: {median * 1000:8.2f} ms  {len(grids) / median:8.1f} media/s  {out.shape[0]} tokens"
        )
    ttft = None if args.no_ttft else measure_ttft(tower, args.ttft_iters)
    record = {
        "ttft": ttft,
        "date": datetime.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name(),
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "what": "vision tower, 27B geometry, random bf16 weights, SDPA per segment group",
        "results": results,
    }
    if args.json:
        args.json.write_text(json.dumps(record, indent=2) + "\n")


def measure_ttft(tower: VisionTower, iters: int, geometry: str = "qwen3.6-27b") -> dict[str, float]:
    """Median TTFT (seconds) of a one-image request and of a text-only one of the same token count."""
    import io
    import time

    from PIL import Image

    from engine.config import EngineConfig
    from engine.core import EngineCore
    from engine.media import ImageProcessorConfig, MediaItem, MediaTokens, prepare_image, prompt_media
    from engine.model.vision_load import VisionParts
    from engine.request import SamplingParams, TokenEvent
    from engine.testing.synthetic import load_synthetic

    model, tokenizer, _ = load_synthetic(geometry)
    tokens = MediaTokens(248056, 248057, 248053, 248054)
    parts = VisionParts(tower, tokens, ImageProcessorConfig())
    config = EngineConfig.from_flags(vision=True, max_context=8192, prefix_reuse=False)
    core = EngineCore(model, tokenizer, config, vision=parts)
    buf = io.BytesIO()
    Image.effect_noise((1024, 1024), 64).convert("RGB").save(buf, "PNG")
    start = time.perf_counter()
    prepared = prepare_image(buf.getvalue(), ImageProcessorConfig())
    preprocess_s = time.perf_counter() - start
    text = tokenizer.encode("Describe the picture in detail, please. " * 8)
    ids = text[:40] + [248053] + [248056] * prepared.num_tokens + [248054] + text[40:]
    media = prompt_media(ids, [MediaItem.image(prepared)], tokens)
    plain = (text * (len(ids) // len(text) + 1))[: len(ids)]
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)

    def once(rid: str, prompt: list[int], with_media: bool) -> float:
        t0 = time.perf_counter()
        core.add_request(rid, prompt, params, media=media if with_media else None)
        first = None
        while core.has_work():
            for event in core.step():
                if isinstance(event, TokenEvent) and first is None:
                    if torch.cuda.is_available():
                        torch.cuda.synchronize()
                    first = time.perf_counter() - t0
        assert first is not None
        return first

    once("warm-image", ids, True), once("warm-text", plain, False)
    image_s = statistics.median(once(f"i{k}", ids, True) for k in range(iters))
    text_s = statistics.median(once(f"t{k}", plain, False) for k in range(iters))
    print(f"TTFT at {len(ids)} tokens: one 1024x1024 image {image_s * 1000:.1f} ms, text only {text_s * 1000:.1f} ms "
          f"(+{(image_s - text_s) * 1000:.1f} ms); preprocessing {preprocess_s * 1000:.1f} ms on the host")  # fmt: skip
    return {"prompt_tokens": len(ids), "image_s": image_s, "text_s": text_s, "preprocess_s": preprocess_s}


if __name__ == "__main__":
    main()
