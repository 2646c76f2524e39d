"""Copies between GDN state slots: a speculative round's rollback (every GDN layer's state of a snapshot slot into
a row's working slot, engine/cache/kv.py `ModelCache.copy_states`).

A state kind of every GDN layer is one stack ``[L, S, ...]`` (L layers, S slots); a rollback moves, for each row i,
slot ``src[i]`` onto slot ``dst[i]`` in every layer. The row indices live on the device (the acceptance that picks
them is never read back), so a row that kept all its drafts, whose working slot already holds its state, names its
own slot: ``src[i] == dst[i]``.

``copy_state_slots_ref`` is the specification: a gather and a scatter of every row (an own-slot row copies its
state onto itself: the same values, but the whole slot read and written twice, ~154 MB of a 27B row's recurrent
state). The Triton launcher ``copy_state_slots`` (``NINFER_ROLLBACK_COPY=skip``, ``kernels._dispatch``) copies each
row's slot straight from source to destination, one read and one write, and masks every load and store of a row
whose source is its destination: no traffic for it. Both are exact copies (bit for bit) and need no host sync.
"""

from __future__ import annotations

import torch

from kernels import _dispatch
from kernels._dispatch import HAS_TRITON, use_triton

if HAS_TRITON:
    import triton
    import triton.language as tl

BLOCK = 4096  # elements a program copies (fp32: 16 KiB read, 16 KiB written)


def copy_state_slots_ref(stack: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """``stack[:, dst[i]] = stack[:, src[i]]`` for every row i, in place, every layer at once.

    stack: [L, S, ...] one state kind of every GDN layer, slots on dim 1; src, dst: [N] int64 slot ids on stack's
    device. The dst slots are distinct and none is another row's src (a row may name its own slot: its state stays).
    """
    stack.index_copy_(1, dst, stack.index_select(1, src))


if HAS_TRITON:

    @triton.jit
    def _copy_state_slots_kernel(
        stack_ptr, src_ptr, dst_ptr, layer_stride, slot_stride, numel, BLOCK: tl.constexpr
    ):
        # grid (cdiv(numel, BLOCK), rows, layers): one program copies BLOCK elements of one row's slot in one
        # layer; a row whose source is its destination masks every load and store (no memory traffic)
        chunk, row, layer = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        src = tl.load(src_ptr + row)
        dst = tl.load(dst_ptr + row)
        offs = chunk * BLOCK + tl.arange(0, BLOCK)
        mask = (offs < numel) & (src != dst)
        base = stack_ptr + layer.to(tl.int64) * layer_stride
        values = tl.load(base + src * slot_stride + offs, mask=mask)
        tl.store(base + dst * slot_stride + offs, values, mask=mask)


def skips_own_slots(skip: bool | None = None) -> bool:
    """Whether the rollback copy runs the Triton kernel (where the kernels run Triton): `skip`, or when None
    ``NINFER_ROLLBACK_COPY`` (``kernels._dispatch.ROLLBACK_COPY``: ``gather``, the default, or ``skip``)."""
    return _dispatch.ROLLBACK_COPY == "skip" if skip is None else skip


def copy_state_slots(
    stack: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, skip: bool | None = None
) -> None:
    """``copy_state_slots_ref``'s copy; rows whose src is their dst move nothing (``skips_own_slots(skip)``, where
    the kernels run Triton; otherwise the reference)."""
    assert src.shape == dst.shape and src.dim() == 1, f"src {tuple(src.shape)}, dst {tuple(dst.shape)}"
    if not skips_own_slots(skip) or not use_triton(stack, src, dst) or src.numel() == 0:
        copy_state_slots_ref(stack, src, dst)
        return
    assert stack.is_contiguous() and stack.dim() >= 2, "a contiguous [L, S, ...] stack"
    assert src.dtype == dst.dtype == torch.int64, f"int64 slot ids, got {src.dtype} / {dst.dtype}"
    layers, numel = stack.shape[0], stack[0, 0].numel()
    grid = (triton.cdiv(numel, BLOCK), src.numel(), layers)
    _copy_state_slots_kernel[grid](stack, src, dst, stack.stride(0), stack.stride(1), numel, BLOCK=BLOCK)
