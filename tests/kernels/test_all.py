"""The kernel reference rule made mechanical: every public kernel is a ``_ref`` with a test module."""

from __future__ import annotations

from pathlib import Path

import kernels


def test_every_exported_kernel_has_a_reference_and_a_test_file():
    here = Path(__file__).parent
    for name in kernels.__all__:
        fn = getattr(kernels, name)
        module = fn.__module__.rsplit(".", 1)[-1]
        assert name.endswith("_ref"), f"{name}: exported without a Triton launcher, so it must be a _ref"
        assert (here / f"test_{module}.py").is_file(), f"{name}: no tests/kernels/test_{module}.py"
        assert fn.__doc__, f"{name}: the reference is the specification and needs a docstring"
