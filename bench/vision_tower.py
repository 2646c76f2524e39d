"""The Qwen3.5 vision tower at the 27B geometry (random weights, bf16): images per second and latency.

Run on a CUDA machine from the repository root:

    python3 bench/vision_tower.py --json bench/results/vision_tower_h200_DATE.json

Geometry: 27 blocks, width 1152, 16 heads x 72, patch 16, merge 2, out 5120 (the 27B text width). Sizes:
one 1024x1024 image (64 x 64 patches -> 1024 tokens) per call, batches of 1/4/8 such images, a 448x448 one,
and an 8-frame 448x448 video (4 temporal groups). Each timing is the median of CUDA-event timed calls after
warm-up, pixels already on the device (preprocessing is not included).
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
    record = {
        "date": datetime.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name(),
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "what": "vision tower, 27B geometry, random bf16 weights, SDPA per segment group",
        "results": results,
    }
    if args.json:
        args.json.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
