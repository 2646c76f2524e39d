"""The Triton GDN state-slot copy (kernels/state_copy.py, `NINFER_ROLLBACK_COPY=skip`) against its reference, bit for
bit (GPU; or CPU under TRITON_INTERPRET=1): fp32 recurrent and bf16 conv stacks, slot sizes that are and are not
multiples of the block, rows that copy another slot beside rows that name their own (a row that kept every draft),
offsets past int32."""

from __future__ import annotations

import pytest
import torch

from kernels.state_copy import BLOCK, copy_state_slots, copy_state_slots_ref

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(
    ("dtype", "shape"),
    [
        (torch.float32, (3, 16, 16)),
        (torch.bfloat16, (40, 3)),
        (torch.float32, (BLOCK + 17,)),
        (torch.float32, (1,)),
    ],
)
def test_the_copy_equals_the_reference_exactly(
    dtype: torch.dtype, shape: tuple[int, ...], device: str
) -> None:
    gen = torch.Generator().manual_seed(sum(shape))
    stack = torch.randn(4, 11, *shape, generator=gen).to(dtype).to(device)
    src = torch.tensor([7, 2, 9, 5], device=device)  # rows 1 and 3 name their own slots
    dst = torch.tensor([0, 2, 4, 5], device=device)
    want = stack.clone()
    copy_state_slots_ref(want, src, dst)
    got = stack.clone()
    copy_state_slots(got, src, dst, skip=True)
    assert torch.equal(got, want)
    assert torch.equal(got[:, [0, 4]], stack[:, [7, 9]]) and torch.equal(
        got[:, [1, 3, 6]], stack[:, [1, 3, 6]]
    )


def test_offsets_past_int32(device: str) -> None:
    """A stack past 2^31 elements (the 27B's recurrent state at K = 15 with 8 lanes: 128 slots x 48 layers x 786,432
    fp32): slot and layer offsets overflow int32, so the kernel indexes in int64. Two bf16 layers of 4,097 slots of
    2^19 elements (8 GiB): layer 1's slot 4,096 starts 2^32 + 2^20 elements in."""
    if device == "cpu":
        pytest.skip("8 GiB is past the interpreter's reach; the int64 offsets are checked on the GPU")
    slots, numel = 4097, 1 << 19
    stack = torch.zeros(2, slots, numel, dtype=torch.bfloat16, device=device)
    stack[1, slots - 1] = 1.0
    stack[0, slots - 1] = 2.0
    src, dst = torch.tensor([slots - 1], device=device), torch.tensor([0], device=device)
    copy_state_slots(stack, src, dst, skip=True)
    assert bool((stack[1, 0] == 1.0).all()) and bool((stack[0, 0] == 2.0).all())
