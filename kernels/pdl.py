"""Programmatic Dependent Launch (PDL, Hopper sm_90 and later) for the Triton kernels of a decode step.

A kernel launched with the PDL attribute (Triton's ``launch_pdl=True``; inside a CUDA graph's stream capture the
launch becomes a programmatic edge) may be scheduled while its predecessor on the stream is still running: its
programs start, run whatever does not depend on the predecessor, and block in ``griddepcontrol.wait`` until the
predecessor has completed and its memory is visible. A decode step is ~600-860 short launches whose gaps are a
few percent of the step; PDL hides them, and lets a GEMV stream its first weight tiles into L2 (weights: no
kernel of a step writes them) while the kernel before it finishes.

``NINFER_PDL`` (``kernels._dispatch``): ``off`` (the default until an H200 measurement) or ``on``. ``pdl_args``
gives a launcher the keywords to pass: ``PDL=True, launch_pdl=True`` when the switch is on, Triton runs on a real
GPU of compute capability 9.0 or more and Triton's interpreter is off; ``PDL=False`` (the same compiled code as
before this switch: every ``pdl_*`` helper compiles to nothing) everywhere else. NOTE: Triton's interpreter cannot
run inline PTX, so under ``TRITON_INTERPRET=1`` PDL is always off and ``launch_pdl`` is never passed.

THE CORRECTNESS RULE (tests/kernels/test_pdl.py checks it from the source, test_aot_sm120.py in the PTX): EVERY kernel whose
launcher passes ``pdl_args`` takes a ``PDL: tl.constexpr`` and calls ``pdl_wait(PDL)`` before it reads anything an
earlier kernel may have written (activations, KV pages, GDN and conv state, page tables, positions and slot
mappings the runner uploads, counters) and before it writes anything (an earlier kernel may still be reading
what it overwrites). Only reads of model weights (parameters, quantized payloads and their scales) may come
before the wait (``pdl_prefetch_l2``). A PDL kernel that skipped the wait could also complete before its
predecessor, so the kernel after it (waiting only for its own predecessor) would see the older kernel's results
half written: one kernel without the wait breaks the chain for every kernel after it. A kernel launched without
PDL (cuBLAS, torch ops, the kernels not converted yet) waits for all earlier work as always, so mixing is safe.

``pdl_launch_dependents(PDL)`` lets the next PDL kernel's programs launch once every program of this kernel has
called it (or exited). It never makes the dependent's reads early (the dependent still waits for this kernel's
completion); it only moves the dependent's launch and prologue (its weight prefetch) forward. The kernels here call
it after their main loop (GEMVs: the dependent's programs start while this kernel stores its outputs), or right
after the wait in the one-wave elementwise kernels, whose dependents (the next GEMV) then prefetch their weights
while this kernel runs.

Converted: the bf16 GEMV and its split-K reduce (``kernels.linear``; the reduce also after the quantized GEMVs), the
norms, RoPE, the K/V store, SiLU-mul and the sigmoid gate, GDN and conv decode, MoE routing, experts and combine, the
fused router, the quantized few-row GEMV (``kernels.quant.triton_gemv``: its first unit of weight planes is loaded
before the wait), the NVFP4 / FP8 Triton GEMVs; and (session 12) the decode attention, bf16 and the int8 grouped and
keys-major kernels, and its reduce (``kernels.attention.decode`` / ``decode_int8``), the fused attention prologue
(``kernels.attention.fuse``), the quantized MoE experts v1 and v2 and the stored-layout group GEMV
(``kernels.quant.triton_group`` / ``triton_moe``: their rows hang on the routed expert ids, so they wait first), and the
Gluon GEMVs (``kernels.quant.gluon_gemv``: pairs, mma, W8 pairs, FP8 rows, NVFP4 rows), which load their split's first
step of weight planes (codes, high bits, scales) before the wait. A Gluon kernel calls the same ``pdl_wait`` /
``pdl_launch_dependents`` (a ``triton.jit`` helper called from a ``gluon.jit`` kernel is generated in Gluon) and
launches with the same ``launch_pdl`` option (``GluonJITFunction`` is a ``JITFunction``: the option reaches
``CUDAOptions.launch_pdl`` and the driver's launch attribute). tests/kernels/test_aot_sm120.py traces, in each PDL
build's PTX, the address of every load before the wait back to the kernel's arguments: weight planes only. Not yet
(plain launches, which is safe): prefill-only kernels, the dequantize kernels, cuBLAS and torch ops.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Mapping

import torch

from kernels import _dispatch
from kernels._dispatch import HAS_TRITON

if HAS_TRITON:
    import triton
    import triton.language as tl

_ON: Mapping[str, bool] = types.MappingProxyType({"PDL": True, "launch_pdl": True})
_OFF: Mapping[str, bool] = types.MappingProxyType({"PDL": False})


@functools.lru_cache(maxsize=16)
def _capable(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device)[0] >= 9


def pdl_enabled(device: torch.device) -> bool:
    """Whether launches on ``device`` use PDL: ``NINFER_PDL=on``, Triton present, not its interpreter, and a
    CUDA device of compute capability 9.0 or more."""
    if _dispatch.PDL_MODE != "on" or _dispatch.INTERPRET or not HAS_TRITON or device.type != "cuda":
        return False
    return _capable(device)


def pdl_args(device: torch.device) -> Mapping[str, bool]:
    """The keywords a launcher adds to a PDL-aware kernel's launch (``kernel[grid](..., **pdl_args(x.device))``):
    ``{"PDL": True, "launch_pdl": True}`` where ``pdl_enabled``, else ``{"PDL": False}`` (no ``launch_pdl``)."""
    return _ON if pdl_enabled(device) else _OFF


if HAS_TRITON:

    @triton.jit
    def pdl_wait(PDL: tl.constexpr):
        # Blocks until the predecessor kernel has completed and its writes are visible (griddepcontrol.wait;
        # a no-op when the launch had no PDL attribute). Nothing at all when PDL is False.
        if PDL:
            tl.extra.cuda.gdc_wait()

    @triton.jit
    def pdl_launch_dependents(PDL: tl.constexpr):
        # Lets the next PDL launch start once every program of this kernel got here (or exited); see the module
        # docstring for where the kernels call it.
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()

    @triton.jit
    def pdl_prefetch_l2(ptrs, PDL: tl.constexpr):
        # One L2 prefetch per pointer (give it one pointer a 128-byte line): for WEIGHTS only, before pdl_wait.
        # The result is a dummy; is_pure=False keeps the instruction.
        if PDL:
            tl.inline_asm_elementwise(
                "prefetch.global.L2 [$1]; // $0", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
            )
