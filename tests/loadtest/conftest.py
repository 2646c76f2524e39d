"""A real `ninfer-serve` for the load-profile tests, and loaders for the modules they use.

The server helpers are `tests/support/ninfer_proc.py` (on pytest's pythonpath); loadtest/'s
locust-free modules load as `ninfer_loadtest_<name>` (their plain names, `report` and `text`, are too
generic to put on sys.path). Locust itself runs only as a CLI subprocess (ECOSYSTEM.md §8): importing it
here would monkey-patch this process with gevent.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import ninfer_proc
import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_module(path: Path, name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def loadtest_module(name: str) -> ModuleType:
    return load_module(ROOT / "loadtest" / f"{name}.py", f"ninfer_loadtest_{name}")


for _name in ("report", "text", "plots"):  # importable as ninfer_loadtest_report / _text / _plots
    loadtest_module(_name)


@pytest.fixture(scope="session")
def load_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ninfer_proc.Server]:
    """Two lanes, so park_resume's four sessions outnumber them; 1024-token context."""
    root = tmp_path_factory.mktemp("load_server")
    with ninfer_proc.serve(root, "--max-concurrency", "2", max_context=1024) as server:
        yield server
