"""Shared comparison helper for the kernel reference tests (fla-style relative RMS + absolute floor), and the
early start of the AOT compile (test_aot_sm120.py) so it runs beside the rest of the suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from kernel_device import interpreter_patches, kernel_device


def _assert_close(
    name: str, actual: torch.Tensor, expected: torch.Tensor, ratio: float = 1e-5, atol: float = 1e-6
) -> None:
    actual, expected = actual.double(), expected.double()
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    err = (actual - expected).abs()
    rms_ratio = (err.pow(2).mean().sqrt() / expected.pow(2).mean().sqrt().clamp_min(1e-30)).item()
    max_abs = err.max().item() if err.numel() else 0.0
    assert rms_ratio <= ratio or max_abs <= atol, (
        f"{name}: rms ratio {rms_ratio:.3e} (limit {ratio:.0e}), max abs {max_abs:.3e}"
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the AOT compile subprocess as soon as the run is known to include its test (see AotCompile)."""
    if any(item.nodeid.endswith("test_every_kernel_compiles_for_sm120_and_sm90") for item in session.items):
        from test_aot_sm120 import AotCompile, _tools_python

        if not _tools_python().exists():
            return  # the report fixture fails the test with the reason

        shared = AotCompile.shared_dir(session.config._tmp_path_factory)  # type: ignore[attr-defined]
        session.config._ninfer_aot_compile = AotCompile(shared)  # type: ignore[attr-defined]


@pytest.fixture
def assert_close():
    return _assert_close


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(1234)


@pytest.fixture
def device() -> str:
    """Where the Triton tests run: the GPU, or the CPU under Triton's interpreter (TRITON_INTERPRET=1)."""
    return kernel_device()


@pytest.fixture(scope="module")
def interpreter_fixes() -> Iterator[None]:
    """``kernel_device.interpreter_patches`` for a whole test module (opt in with
    ``pytest.mark.usefixtures("interpreter_fixes")``)."""
    with interpreter_patches():
        yield
