"""What the sidecar reads besides the request log: the server's `/stats`, `nvidia-smi`, `/proc`."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GPU_QUERY = "index,name,utilization.gpu,memory.used,memory.total,power.draw,power.limit,temperature.gpu"


def fetch_stats(url: str, timeout: float) -> dict[str, Any]:
    """GET `url` (the server's /stats) as JSON; raises OSError / ValueError on failure."""
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - operator-given URL
        data = json.loads(response.read())
    if not isinstance(data, dict):
        raise ValueError(f"{url}: expected a JSON object, got {type(data).__name__}")
    return data


def _float(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def parse_nvidia_smi(text: str) -> list[dict[str, Any]]:
    """Rows of `nvidia-smi --query-gpu=GPU_QUERY --format=csv,noheader,nounits`."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 8:
            continue
        index, name, util, used, total, power, limit, temp = parts
        gpus.append(
            {
                "index": index,
                "name": name,
                "util_pct": _float(util),
                "mem_used_mb": _float(used),
                "mem_total_mb": _float(total),
                "power_w": _float(power),
                "power_limit_w": _float(limit),
                "temp_c": _float(temp),
            }
        )
    return gpus


def read_gpus(timeout: float = 5.0) -> list[dict[str, Any]]:
    """GPUs from `nvidia-smi` when it is on PATH; [] where there is none (or it fails)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        done = subprocess.run(
            [exe, f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_nvidia_smi(done.stdout) if done.returncode == 0 else []


@dataclass
class HostReader:
    """CPU busy % between two reads of /proc/stat, and RAM from /proc/meminfo (Linux; None elsewhere)."""

    proc: Path = Path("/proc")
    _last: tuple[int, int] | None = None

    def cpu_pct(self) -> float | None:
        try:
            fields = (self.proc / "stat").read_text().splitlines()[0].split()[1:]
        except (OSError, IndexError):
            return None
        values = [int(v) for v in fields]
        idle, total = values[3] + (values[4] if len(values) > 4 else 0), sum(values)
        last, self._last = self._last, (idle, total)
        if last is None or total <= last[1]:
            return None
        return 100.0 * (1.0 - (idle - last[0]) / (total - last[1]))

    def ram_mb(self) -> dict[str, float] | None:
        try:
            info = dict(
                line.split(":", 1) for line in (self.proc / "meminfo").read_text().splitlines() if ":" in line
            )
            total = int(info["MemTotal"].split()[0]) / 1024
            available = int(info["MemAvailable"].split()[0]) / 1024
        except (OSError, KeyError, ValueError):
            return None
        return {"used_mb": total - available, "total_mb": total}
