"""bench/host_overhead.py (host time of an eager decode step at the real layer counts, tiny widths): it runs on the
CPU and reports what it says, and its ``--engine-only`` stubs still name launchers the model imports."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import engine.model

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "host_overhead.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("host_overhead", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_35b_geometry_run_reports_steps_and_python_calls_per_layer(tmp_path):
    out = tmp_path / "host.json"
    args = ["--geometry", "qwen3.6-35b-a3b", "--concurrency", "2", "--steps", "1", "--repeats", "1",
            "--warmup", "0", "--profile", "--json", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["geometry"], row["concurrency"], row["layers"]) == ("qwen3.6-35b-a3b", 2, 40)
    assert row["wall_step_us_median"] > 0 and row["cpu_layer_us_median"] > 0
    profile = row["profile"]
    assert profile["calls_per_layer"] == round(profile["calls_per_step"] / 40, 1)
    assert set(profile["by_where"]) >= {"engine", "kernels", "nn.Module calls"}
    assert "qwen3.6-35b-a3b C=2 (40 layers, cpu" in done.stdout


def test_every_engine_only_stub_replaces_a_launcher_the_model_imports():
    stubs = _load_script().STUBS
    imported = set()
    for info in pkgutil.iter_modules(engine.model.__path__):
        module = importlib.import_module(f"engine.model.{info.name}")
        imported |= {name for name in stubs if callable(getattr(module, name, None))}
    assert imported == set(stubs)
