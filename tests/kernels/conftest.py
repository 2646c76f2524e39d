"""Shared comparison helper for the kernel reference tests (fla-style relative RMS + absolute floor), and the
early start of the AOT compile (test_aot_sm120.py) so it runs beside the rest of the suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from kernel_device import kernel_device


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
    """NOTE: two gaps of Triton 3.6's interpreter that kernels with ``tl.dot`` or run-time loop bounds meet
    (nothing changes on the GPU; a test module opts in with ``pytest.mark.usefixtures("interpreter_fixes")``):
    - it keeps scalars as 1-element arrays and turns one into a ``range`` bound with ``int(array)``, which
      NumPy >= 2.4 refuses (the attention decode kernel loops to the sequence's length): convert with
      ``.item()``;
    - ``tl.dot`` on bf16 operands multiplies their raw uint16 storage: widen them to fp32 first (exact, as
      the tensor cores' bf16 products are)."""
    from kernels._dispatch import INTERPRET

    if not INTERPRET:
        yield
        return
    import numpy as np
    import triton.language as tl
    import triton.runtime.interpreter as interpreter

    original_patch, original_dot = interpreter._patch_lang_tensor, interpreter.InterpreterBuilder.create_dot

    def patch_tensor(tensor: type, scope: interpreter._LangPatchScope) -> None:
        original_patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    def widen(x: interpreter.TensorHandle) -> interpreter.TensorHandle:
        if x.dtype.scalar != tl.bfloat16:
            return x
        data = (x.data.astype(np.uint32) << 16).view(np.float32)  # bf16 is the high half of an fp32
        return interpreter.TensorHandle(data, tl.float32)

    def dot(self, a, b, d, input_precision, max_num_imprecise_acc):  # noqa: ANN001, ANN202
        return original_dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(interpreter, "_patch_lang_tensor", patch_tensor)
        mp.setattr(interpreter.InterpreterBuilder, "create_dot", dot)
        yield
