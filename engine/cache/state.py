"""StateSlotPool: which GDN state slot holds whose state.

A *state slot* is one index into the model's GDN cache tensors: for every GDN layer, its conv
history and recurrent state (`conv_state[layer][slot]`, `recurrent_state[layer][slot]`; later also
the continuation hidden state for MTP). Owns: slot ids and whether each is free. Must not touch the
tensors: copies between slots and zeroing are runner-executed ops that the scheduler describes in
`StepPlan` (engine/step.py: `reset_state`, `copy_state_from`, `save_state_to`).

All slots are alike; ownership moves, contents move only when the scheduler asks for a copy:

    slot ids   0 ............................................... num_lanes + max_checkpoints - 1
               [ working slots of running requests | checkpoint snapshots | free            ]
                 (one per lane in use; the lane      (one per Checkpoint;
                  writes it every step)               read-only, restored by copy)

A finished request's working slot becomes its retained checkpoint's snapshot without a copy; a new
request gets a free slot and either zeroes it or copies a snapshot into it before its first step.
"""

from __future__ import annotations

from collections import deque


class StateSlotPool:
    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots={num_slots!r}: must be >= 1")
        self.num_slots = num_slots
        self._free: deque[int] = deque(range(num_slots))
        self._is_free = [True] * num_slots

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int | None:
        """A free slot id, or None when every slot is held."""
        if not self._free:
            return None
        slot = self._free.popleft()
        self._is_free[slot] = False
        return slot

    def free(self, slot: int) -> None:
        if self._is_free[slot]:
            raise RuntimeError(f"free(): state slot {slot} is already free")
        self._is_free[slot] = True
        self._free.append(slot)

    def check_integrity(self, held: list[int]) -> None:
        """`held` lists every slot some owner claims; each must be held once and the rest free."""
        if len(set(held)) != len(held):
            dupes = sorted({s for s in held if held.count(s) > 1})
            raise RuntimeError(f"state slots held twice: {dupes}")
        if len(set(self._free)) != len(self._free):
            raise RuntimeError(f"free state slot list has duplicates: {list(self._free)}")
        free = set(self._free)
        if free & set(held):
            raise RuntimeError(f"state slots both free and held: {sorted(free & set(held))}")
        if len(free) + len(held) != self.num_slots:
            raise RuntimeError(f"{len(free)} free + {len(held)} held state slots != {self.num_slots} slots")
        if {s for s in range(self.num_slots) if self._is_free[s]} != free:
            raise RuntimeError("state slot free flags disagree with the free list")
