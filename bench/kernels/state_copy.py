"""The speculative rollback's GDN state copy at the real geometries (kernels/state_copy.py): the gather + scatter of
`NINFER_ROLLBACK_COPY=gather` against the Triton copy of `skip`, for C rows that all rejected their drafts (each
copies a snapshot slot) and that all kept them (each names its own slot: `skip` moves nothing), both state kinds of
every GDN layer, as `ModelCache.copy_states` runs them. Median microseconds (triton.testing.do_bench) and the
bytes the copy of one row moves once (read + write); on the device machine:

    python3 bench/kernels/state_copy.py --json $WORK/state_copy.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.model.forward import allocate_model_cache  # noqa: E402
from engine.testing.synthetic import GEOMETRIES  # noqa: E402
from kernels.state_copy import copy_state_slots  # noqa: E402

LANES, K = 8, 3  # snapshot slots: K a lane (engine/runner/speculative.py num_spec_slots)


def bench(name: str) -> list[dict[str, object]]:
    config = GEOMETRIES[name]
    cache = allocate_model_cache(config, 1, 64, LANES + LANES * K, torch.bfloat16, "cuda")
    row_bytes = 2 * sum(t[:, 0].numel() * t.element_size() for t in cache.state_stacks)
    rows = []
    for c in (1, 8):
        slots = torch.arange(c, device="cuda")
        snapshots = LANES + slots * K  # each lane's first snapshot: every draft rejected
        for kept, src in (("none", snapshots), ("all", slots)):
            for mode in ("gather", "skip"):

                def run(
                    src: torch.Tensor = src, dst: torch.Tensor = slots, skip: bool = mode == "skip"
                ) -> None:
                    for stack in cache.state_stacks:
                        copy_state_slots(stack, src, dst, skip=skip)

                us = triton.testing.do_bench(run, warmup=10, rep=100, return_mode="median") * 1e3
                rows.append({"model": name, "concurrency": c, "drafts_kept": kept, "mode": mode, "us": round(us, 2),
                             "row_mib": round(row_bytes / 2**20, 1)})  # fmt: skip
                print(rows[-1], flush=True)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args()
    git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False).stdout
    commit = os.environ.get("NINFER_COMMIT") or git  # scripts/device/stages.sh exports the commit measured
    report = {"what": "rollback GDN state copy, gather vs skip", "date": datetime.date.today().isoformat(),
              "gpu": torch.cuda.get_device_name(), "commit": commit.strip(),
              "rows": [r for name in ("qwen3.6-27b", "qwen3.6-35b-a3b") for r in bench(name)]}  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
