"""Causal depthwise conv1d references: naive loop, chunk handoff, decode step, varlen slots."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.conv import (
    causal_conv1d_decode_ref,
    causal_conv1d_ref,
    causal_conv1d_update_ref,
    causal_conv1d_varlen_ref,
)


def _naive_conv(x: torch.Tensor, w: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
    """history: [K - 1, C] inputs before x. out[t, c] = silu(sum_j w[c, j] * full[t + j, c])."""
    full = torch.cat([history, x]).tolist()
    kernel = w.shape[1]
    out = torch.empty_like(x)
    for t in range(x.shape[0]):
        for c in range(x.shape[1]):
            out[t, c] = sum(w[c, j].item() * full[t + j][c] for j in range(kernel))
    return F.silu(out)


def test_prefill_from_zero_state_matches_naive(assert_close):
    x, w = torch.randn(63, 13), torch.randn(13, 4)
    out, state = causal_conv1d_ref(x, w)
    assert_close("out", out, _naive_conv(x, w, torch.zeros(3, 13)))
    assert torch.equal(state, x[-3:].t())


def test_prefill_from_initial_state_matches_naive(assert_close):
    x, w, init = torch.randn(5, 13), torch.randn(13, 4), torch.randn(13, 3)
    out, _ = causal_conv1d_ref(x, w, init)
    assert_close("out", out, _naive_conv(x, w, init.t()))


def test_short_chunk_state_keeps_older_history():
    x, w, init = torch.randn(2, 7), torch.randn(7, 4), torch.randn(7, 3)
    _, state = causal_conv1d_ref(x, w, init)
    assert torch.equal(state, torch.cat([init[:, 2:], x.t()], dim=1))


def test_uneven_chunks_and_decode_steps_equal_one_pass(assert_close):
    x, w = torch.randn(63, 11), torch.randn(11, 4)
    full, full_state = causal_conv1d_ref(x, w)
    state, pieces = None, []
    for a, b in [(0, 1), (1, 30), (30, 31), (31, 60)]:
        out, state = causal_conv1d_ref(x[a:b], w, state)
        pieces.append(out)
    for t in range(60, 63):  # single-token update form
        out, new = causal_conv1d_update_ref(x[t : t + 1], state[None], w)
        pieces.append(out)
        state = new[0]
    assert_close("chunked", torch.cat(pieces), full, ratio=1e-6)
    assert torch.equal(state, full_state)


def test_varlen_uses_and_updates_only_named_slots(assert_close):
    w = torch.randn(9, 4)
    lens, slots, cont = [7, 1, 12], [3, 0, 1], [True, True, False]
    pool = torch.randn(5, 9, 3)
    before = pool.clone()
    x = torch.randn(sum(lens), 9)
    cu = torch.tensor([0, 7, 8, 20])
    out = causal_conv1d_varlen_ref(x, w, pool, cu, torch.tensor(slots), torch.tensor(cont))
    for b, (start, end) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        init = before[slots[b]] if cont[b] else None
        expected, state = causal_conv1d_ref(x[start:end], w, init)
        assert_close(f"seq{b}", out[start:end], expected, ratio=1e-7)
        assert torch.equal(pool[slots[b]], state)
    for untouched in (2, 4):
        assert torch.equal(pool[untouched], before[untouched])


def test_decode_out_of_place_writes_the_in_place_state_elsewhere():
    """out_slots: each row reads its state at state_slots and writes the update at out_slots: the same output
    and the same new state as in place, the source slot untouched; a negative slot (in or out) writes nothing."""
    channels, kernel = 13, 4
    x, weight = torch.randn(4, channels), torch.randn(channels, kernel)
    pool = torch.randn(10, channels, kernel - 1)
    slots, keep = torch.tensor([3, 0, -1, 5]), torch.tensor([True, False, True, True])
    out_slots = torch.tensor([7, 2, 9, -1])  # row 2: padding (reads nothing, writes nowhere); row 3: no write
    in_place = pool.clone()
    expected = causal_conv1d_decode_ref(x, weight, in_place, slots, keep)
    moved = pool.clone()
    out = causal_conv1d_decode_ref(x, weight, moved, slots, keep, out_slots=out_slots)
    assert torch.equal(out, expected) and torch.all(out[2] == 0)
    assert torch.equal(moved[[7, 2]], in_place[[3, 0]])  # the in-place results, written to the out slots
    untouched = [s for s in range(10) if s not in (7, 2)]  # the sources 3, 0 and 5, the padding row's 9
    assert torch.equal(moved[untouched], pool[untouched])
