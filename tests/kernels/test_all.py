"""The kernel reference rule made mechanical: every public kernel is a ``_ref`` with a test module, and
every Triton launcher has a ``_ref`` of the same signature and a GPU test module."""

from __future__ import annotations

import inspect
from pathlib import Path

import kernels


def test_every_exported_kernel_has_a_reference_and_a_test_file():
    here = Path(__file__).parent
    for name in kernels.__all__:
        fn = getattr(kernels, name)
        # kernels.<op> or a package's kernels.<op>.<part>: the tests are named after the part, else the op
        # (kernels.attention.decode -> test_attention.py, kernels.quant.quant_linear -> test_quant_linear.py).
        parts = fn.__module__.split(".")[1:]
        module = next((p for p in reversed(parts) if (here / f"test_{p}.py").is_file()), parts[-1])
        assert (here / f"test_{module}.py").is_file(), f"{name}: no tests/kernels/test_{module}.py"
        assert fn.__doc__, f"{name}: needs a docstring (a reference is the specification)"
        if name.endswith("_ref"):
            continue
        ref = getattr(kernels, f"{name}_ref", None)
        assert ref is not None, f"{name}: a launcher without {name}_ref in kernels.__all__"
        launcher_params = list(inspect.signature(fn).parameters)
        ref_params = list(inspect.signature(ref).parameters)
        assert launcher_params[: len(ref_params)] == ref_params, (
            f"{name}{launcher_params} does not start with {name}_ref{ref_params}"
        )
        assert (here / f"test_{module}_triton.py").is_file(), (
            f"{name}: no tests/kernels/test_{module}_triton.py"
        )
