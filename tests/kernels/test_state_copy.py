"""The GDN state-slot copy's reference (kernels/state_copy.py): a rollback moves each row's source slot onto its
destination in every layer of a stack and touches no other slot; a row naming its own slot keeps its state; off the
GPU the launcher is the reference whatever the switch says."""

from __future__ import annotations

import torch

from kernels.state_copy import copy_state_slots, copy_state_slots_ref


def _stack(layers: int = 3, slots: int = 9, shape: tuple[int, ...] = (5, 7)) -> torch.Tensor:
    return torch.randn(layers, slots, *shape, generator=torch.Generator().manual_seed(slots))


def test_the_reference_moves_each_rows_slot_in_every_layer_and_nothing_else() -> None:
    stack = _stack()
    before = stack.clone()
    src, dst = torch.tensor([4, 1, 2]), torch.tensor([0, 5, 2])  # row 2 names its own slot
    copy_state_slots_ref(stack, src, dst)
    assert torch.equal(stack[:, [0, 5, 2]], before[:, [4, 1, 2]])
    untouched = [s for s in range(stack.shape[1]) if s not in (0, 5)]
    assert torch.equal(stack[:, untouched], before[:, untouched])


def test_the_launcher_off_the_gpu_is_the_reference() -> None:
    stack, want = _stack(2, 6, (33,)), _stack(2, 6, (33,))
    src, dst = torch.tensor([3, 4]), torch.tensor([3, 1])
    copy_state_slots(stack, src, dst, skip=True)
    copy_state_slots_ref(want, src, dst)
    assert torch.equal(stack, want)
