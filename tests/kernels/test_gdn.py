"""Gated delta rule references: naive per-head loop, chunked == recurrent, state handoff, varlen."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.gdn import (
    chunk_gated_delta_rule_ref,
    gated_delta_rule_decode_ref,
    gated_delta_rule_varlen_ref,
    recurrent_gated_delta_rule_ref,
)


def _inputs(batch: int, tokens: int, hk: int, hv: int, dk: int, dv: int) -> tuple[torch.Tensor, ...]:
    q, k = torch.randn(batch, tokens, hk, dk), torch.randn(batch, tokens, hk, dk)
    v = torch.randn(batch, tokens, hv, dv)
    g = -F.softplus(torch.randn(batch, tokens, hv)) * 0.5
    beta = torch.rand(batch, tokens, hv)
    return q, k, v, g, beta


def _naive(q, k, v, g, beta, init):
    """Literal per-sequence, per-head, per-token loop in float64 (one sequence: no batch dim)."""
    tokens, hk, dk = q.shape
    hv, dv = v.shape[1:]
    out = torch.zeros(tokens, hv, dv, dtype=torch.float64)
    state = init.double().clone()
    for h in range(hv):
        kh = h // (hv // hk)
        s = state[h]
        for t in range(tokens):
            qt = q[t, kh].double() / q[t, kh].double().pow(2).sum().add(1e-6).sqrt() * dk**-0.5
            kt = k[t, kh].double() / k[t, kh].double().pow(2).sum().add(1e-6).sqrt()
            s = s * torch.exp(g[t, h].double())
            delta = beta[t, h].double() * (v[t, h].double() - s.t() @ kt)
            s = s + torch.outer(kt, delta)
            out[t, h] = s.t() @ qt
        state[h] = s
    return out, state


@pytest.mark.parametrize(("hk", "hv", "dk", "dv"), [(2, 6, 24, 20), (1, 1, 60, 12)])
def test_recurrent_matches_naive_loop(hk, hv, dk, dv, assert_close):
    q, k, v, g, beta = _inputs(2, 19, hk, hv, dk, dv)
    init = torch.randn(2, hv, dk, dv) * 0.1
    out, state = recurrent_gated_delta_rule_ref(q, k, v, g, beta, init)
    for b in range(2):
        eo, es = _naive(q[b], k[b], v[b], g[b], beta[b], init[b])
        assert_close(f"out{b}", out[b], eo)
        assert_close(f"state{b}", state[b], es)


@pytest.mark.parametrize("chunk_size", [64, 16, 7])
def test_chunked_equals_recurrent_on_odd_length(chunk_size, assert_close):
    q, k, v, g, beta = _inputs(2, 63, 2, 4, 24, 20)
    init = torch.randn(2, 4, 24, 20) * 0.1
    ro, rs = recurrent_gated_delta_rule_ref(q, k, v, g, beta, init)
    co, cs = chunk_gated_delta_rule_ref(q, k, v, g, beta, init, chunk_size=chunk_size)
    assert_close("out", co, ro)
    assert_close("state", cs, rs)


def test_chunked_prefill_hands_state_to_recurrent_decode(assert_close):
    q, k, v, g, beta = _inputs(1, 63, 2, 6, 16, 12)
    full_out, full_state = chunk_gated_delta_rule_ref(q, k, v, g, beta)
    pre_out, state = chunk_gated_delta_rule_ref(q[:, :40], k[:, :40], v[:, :40], g[:, :40], beta[:, :40])
    mid_out, state = chunk_gated_delta_rule_ref(q[:, 40:57], k[:, 40:57], v[:, 40:57], g[:, 40:57], beta[:, 40:57],
                                                state, chunk_size=5)  # fmt: skip
    outs = [pre_out, mid_out]
    for t in range(57, 63):
        o, state = recurrent_gated_delta_rule_ref(q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], g[:, t : t + 1],
                                                  beta[:, t : t + 1], state)  # fmt: skip
        outs.append(o)
    assert_close("out", torch.cat(outs, dim=1), full_out)
    assert_close("state", state, full_state)


def test_varlen_mixes_chunks_and_decode_tokens_and_respects_slots(assert_close):
    lens, slots, cont = [9, 1, 1, 14], [2, 0, 4, 1], [False, True, True, True]
    total = sum(lens)
    q, k, v, g, beta = (x[0] for x in _inputs(1, total, 2, 4, 8, 6))
    pool = torch.randn(6, 4, 8, 6) * 0.1
    pool[2] = float("nan")  # a slot started fresh must not read its stale contents
    before = pool.clone()
    cu = torch.tensor([0, 9, 10, 11, 25])
    out = gated_delta_rule_varlen_ref(q, k, v, g, beta, pool, cu, torch.tensor(slots), torch.tensor(cont))
    for b, (start, end) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        init = before[slots[b]][None] if cont[b] else None
        sl = slice(start, end)
        eo, es = recurrent_gated_delta_rule_ref(
            q[None, sl], k[None, sl], v[None, sl], g[None, sl], beta[None, sl], init
        )
        assert_close(f"out{b}", out[sl], eo[0])
        assert_close(f"state{b}", pool[slots[b]], es[0])
    assert torch.equal(pool[3], before[3]) and torch.equal(pool[5], before[5])


def test_decode_out_of_place_writes_the_in_place_state_elsewhere():
    """out_slots: each row reads its state at state_slots and writes the update at out_slots: the same output
    and the same new state as in place, the source slot untouched; a negative slot (in or out) writes nothing."""
    hk, hv, dk, dv = 2, 4, 8, 6
    q, k = torch.randn(4, hk, dk), torch.randn(4, hk, dk)
    v, a, b = torch.randn(4, hv, dv), torch.randn(4, hv), torch.randn(4, hv)
    gates = (torch.randn(hv), torch.randn(hv))
    pool = torch.randn(10, hv, dk, dv)
    slots, keep = torch.tensor([3, 0, -1, 5]), torch.tensor([True, False, True, True])
    out_slots = torch.tensor([7, 2, 9, -1])  # row 2: padding (reads nothing, writes nowhere); row 3: no write
    in_place = pool.clone()
    expected = gated_delta_rule_decode_ref(q, k, v, a, b, *gates, in_place, slots, keep)
    moved = pool.clone()
    out = gated_delta_rule_decode_ref(q, k, v, a, b, *gates, moved, slots, keep, out_slots=out_slots)
    assert torch.equal(out, expected) and torch.all(out[2] == 0)
    assert torch.equal(moved[[7, 2]], in_place[[3, 0]])  # the in-place results, written to the out slots
    untouched = [s for s in range(10) if s not in (7, 2)]  # the sources 3, 0 and 5, the padding row's 9
    assert torch.equal(moved[untouched], pool[untouched])
