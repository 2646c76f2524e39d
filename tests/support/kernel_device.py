"""Where a `-m gpu` kernel test runs: the GPU, or the CPU under Triton's interpreter (TRITON_INTERPRET=1).
Missing Triton or CUDA fails the test (never a skip): these tests only run under `-m gpu`. And the interpreter's
patches those tests need (`interpreter_patches`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch


def kernel_device() -> str:
    from kernels._dispatch import HAS_TRITON, INTERPRET

    if not HAS_TRITON:
        pytest.fail("the gpu tests need Triton: run them on the device machine (make test-gpu)")
    if INTERPRET:
        return "cpu"
    if not torch.cuda.is_available():
        pytest.fail("the gpu tests need a CUDA device (or TRITON_INTERPRET=1)")
    return "cuda"


@contextmanager
def interpreter_patches() -> Iterator[None]:
    """NOTE: two gaps of Triton 3.6's interpreter that kernels with ``tl.dot`` or run-time loop bounds meet
    (nothing changes on the GPU; tests/kernels opt in per module with ``pytest.mark.usefixtures("interpreter_fixes")``,
    other tests enter this context):
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
