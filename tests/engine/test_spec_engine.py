"""DESIGN invariant 3 through the real engine on the tiny dense and MoE artifacts (float32, CPU): greedy
output with `--spec mtp` is exactly the output without it, for every K 1..5, alone and batched, with
prefix reuse and host parking; drafts that always agree give K + 1 tokens per round, drafts that never
agree give 1; rollback leaves the GDN state bit-identical to a non-speculative run at the same position.

The tiny models' MTP heads have random weights, so their own drafts are almost never accepted; the
acceptance paths are driven by an oracle drafter that proposes the non-speculative run's own tokens
(optionally wrong from a given draft on), wrapped around the real one (its MTP KV bookkeeping still runs).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable

import pytest
import torch
from engine_harness import GREEDY, make_core, one_thread, prompt, run, tiny_artifact

from engine.config import EngineConfig
from engine.core import EngineCore, load_artifact
from engine.request import SamplingParams

PARAMS = SamplingParams(temperature=0.0, max_tokens=14)
# The MoE preset's presence penalty off (penalized rows never take the one-wait round: their counts are the host's)
NO_PENALTY = SamplingParams(temperature=0.0, max_tokens=14, presence_penalty=0.0)
LENGTHS = [5, 17, 40]


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


@functools.cache
def _loaded_mtp(arch: str, dtype: torch.dtype = torch.float32):
    return load_artifact(tiny_artifact(arch), device="cpu", dtype=dtype, with_mtp=True)


def spec_core(
    arch: str, k: int | None, dtype: torch.dtype = torch.float32, one_wait: bool = True, **flags
) -> EngineCore:
    """An engine on the tiny model with its MTP head; k None = speculation off. one_wait=False: every round takes
    the general path (engine/runner/spec_round.py says when the one-wait round runs)."""
    flags.setdefault("max_context", 512)
    flags.setdefault("prefill_chunk_multiple", 1)
    loaded = _loaded_mtp(arch, dtype)
    spec = {"spec": "mtp", "draft_tokens": k} if k is not None else {}
    config = EngineConfig.from_flags(**spec, **flags)
    core = EngineCore(loaded.model, loaded.tokenizer, config, seed=0)
    if core.runner.spec is not None:
        core.runner.spec.one_wait = one_wait
    return core


@functools.cache
def _baseline(
    arch: str, lengths: tuple[int, ...], max_tokens: int, presence_penalty: float | None = None
) -> list[list[int]]:
    core = make_core(arch, prefix_reuse=False, max_concurrency=len(lengths))
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, presence_penalty=presence_penalty)
    return run(core, [prompt(n, s) for s, n in enumerate(lengths)], params)[0]


def _oracle(core: EngineCore, want: dict[str, list[int]], wrong_from: Callable[[str, int], int]) -> None:
    """Replace the drafts by the expected continuation, wrong from draft `wrong_from(request, round)` on. Wraps the
    speculative step (`SpecExecutor.run`), so both rounds (the one-wait greedy round and the general one) run."""
    spec = core.runner.spec
    assert spec is not None
    real = spec.run
    rounds: dict[str, int] = {}

    def run(rows, history, plain_sample):
        out = real(rows, history, plain_sample)
        drafts = list(out.drafts)
        for i, (row, proposal) in enumerate(zip(rows, out.drafts, strict=True)):
            if not proposal:
                continue
            n = len(history[row.request_id])
            truth = want[row.request_id][n : n + len(proposal)]
            r = rounds[row.request_id] = rounds.get(row.request_id, 0) + 1
            bad = wrong_from(row.request_id, r)
            new = [t if j < bad else (t + 1) % 1000 + 7 for j, t in enumerate(truth)]
            drafts[i] = (*new, *[7] * (len(proposal) - len(new)))
        return dataclasses.replace(out, drafts=tuple(drafts))

    spec.run = run  # type: ignore[method-assign]


@pytest.mark.parametrize("arch", ["dense", "moe"])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("one_wait", [True, False])
def test_greedy_spec_equals_plain_alone_and_batched(arch, k, one_wait):
    """one_wait: the one-wait greedy round where it applies (penalty-free rows); else the general round, with the
    presets' penalties (the MoE preset's presence penalty)."""
    params = NO_PENALTY if one_wait else PARAMS
    want = _baseline(arch, tuple(LENGTHS), PARAMS.max_tokens, params.presence_penalty)
    prompts = [prompt(n, s) for s, n in enumerate(LENGTHS)]
    alone = spec_core(arch, k, one_wait=one_wait, prefix_reuse=False)
    assert [run(alone, [p], params)[0][0] for p in prompts] == want
    batched = spec_core(arch, k, one_wait=one_wait, max_concurrency=3, prefill_chunk=16)
    assert run(batched, prompts, params)[0] == want
    stats = batched.scheduler.spec_stats
    assert stats.rounds > 0 and stats.drafted >= stats.rounds
    spec = batched.runner.spec
    assert spec is not None and (spec.num_one_wait_rounds > 0) == one_wait


@pytest.mark.parametrize("arch", ["dense", "moe"])
@pytest.mark.parametrize("k", [2, 3, 5])
@pytest.mark.parametrize("one_wait", [True, False])
def test_a_stop_token_inside_an_accepted_round_ends_the_request_there(arch, k, one_wait):
    """Drafts that always agree commit k + 1 tokens a round; a stop token among them (not at a round's end) ends
    the request at that token, with the plain run's output, on the one-wait round and the general one, batched
    beside requests that go on."""
    want = _baseline(arch, tuple(LENGTHS), PARAMS.max_tokens, 0.0)
    stop = want[1][5]
    params = SamplingParams(
        temperature=0.0, max_tokens=PARAMS.max_tokens, presence_penalty=0.0, stop_token_ids=(stop,)
    )
    prompts = [prompt(n, s) for s, n in enumerate(LENGTHS)]
    plain = run(make_core(arch, prefix_reuse=False, max_concurrency=3), prompts, params)[0]
    assert plain[1] == want[1][: want[1].index(stop) + 1] and len(plain[1]) < len(want[1])
    core = spec_core(arch, k, one_wait=one_wait, max_concurrency=3)
    _oracle(core, {f"r{i}": w for i, w in enumerate(want)}, lambda _r, _n: k)
    assert run(core, prompts, params)[0] == plain
    spec = core.runner.spec
    assert spec is not None and (spec.num_one_wait_rounds > 0) == one_wait
    assert core.scheduler.spec_stats.accepted > 0


@pytest.mark.parametrize("arch", ["dense", "moe"])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_drafts_that_always_agree_give_k_plus_one_tokens_per_round(arch, k):
    want = _baseline(arch, tuple(LENGTHS), PARAMS.max_tokens)
    core = spec_core(arch, k, max_concurrency=3)
    ids = [f"r{i}" for i in range(3)]
    _oracle(core, dict(zip(ids, want, strict=True)), lambda _r, _n: k)
    got = run(core, [prompt(n, s) for s, n in enumerate(LENGTHS)], PARAMS)[0]
    assert got == want
    stats = core.scheduler.spec_stats
    assert stats.accepted == stats.drafted > 0, stats
    assert stats.accepted_per_position == [stats.rounds] * k
    # every verify round committed k + 1 tokens until the length limit shrank the drafts
    steps_after_prefill = -(-(PARAMS.max_tokens - 1) // (k + 1))
    assert stats.rounds + stats.fallbacks <= 3 * steps_after_prefill


@pytest.mark.parametrize("arch", ["dense", "moe"])
def test_drafts_that_never_agree_give_one_token_per_round(arch):
    want = _baseline(arch, tuple(LENGTHS), PARAMS.max_tokens)
    core = spec_core(arch, 3, max_concurrency=3)
    _oracle(core, {f"r{i}": w for i, w in enumerate(want)}, lambda _r, _n: 0)
    assert run(core, [prompt(n, s) for s, n in enumerate(LENGTHS)], PARAMS)[0] == want
    stats = core.scheduler.spec_stats
    assert stats.accepted == 0 and stats.rounds == 3 * (PARAMS.max_tokens - 1) - stats.fallbacks


def _final_state(core: EngineCore) -> tuple[int, list[torch.Tensor]]:
    """The longest retained checkpoint's length and its GDN state (conv and recurrent of every layer)."""
    assert core.scheduler.prefix is not None
    cp = max(core.scheduler.prefix.checkpoints, key=lambda c: c.num_tokens)
    cache = core.runner.cache
    return cp.num_tokens, [t[cp.state_slot].clone() for t in (*cache.conv_state, *cache.recurrent_state)]


@pytest.mark.parametrize("arch", ["dense", "moe"])
@pytest.mark.parametrize("wrong", [0, 1, 2])
def test_rollback_leaves_the_gdn_state_of_a_plain_run(arch, wrong):
    """Every round rejects draft `wrong` (and the rest): the state is rolled back to the accepted position
    each round; at the end it equals the plain run's state at the same position.

    NOTE: a tolerance, not bit equality end to end: the verify forward's linears multiply [k+1, H] rows
    where the plain run multiplies [1, H], and CPU GEMMs round differently by shape, so the GDN layers see
    inputs that differ in the last bits (measured: <= 5e-5 after 10 rounds, while a state one position off
    differs by ~1e-1). The rollback itself is bit-exact given the same inputs
    (test_rollback_is_bit_exact_in_the_layer). The kernels have no float64 path to shrink this further."""
    p = [prompt(23, 5)]
    params = SamplingParams(temperature=0.0, max_tokens=11)
    plain = make_core(arch)
    want = run(plain, p, params)[0]
    core = spec_core(arch, 3)
    _oracle(core, {"r0": want[0]}, lambda _r, _n: wrong)
    assert run(core, p, params)[0] == want
    assert core.scheduler.spec_stats.accepted == wrong * core.scheduler.spec_stats.rounds
    n_plain, plain_state = _final_state(plain)
    n_spec, spec_state = _final_state(core)
    assert n_plain == n_spec == 23 + 11 - 1
    for a, b in zip(plain_state, spec_state, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-2, atol=5e-4)


@pytest.mark.parametrize("accepted", [0, 1, 2, 3])
def test_rollback_is_bit_exact_in_the_layer(accepted):
    """A GDN layer's verify pass over W = 4 positions (two sequences), rolled back to position `accepted`
    (the runner's copy of that position's snapshot into the working slot, `ModelCache.copy_states`), leaves
    exactly the state of decoding positions 0..accepted one step at a time from the same inputs."""
    from engine.model.forward import allocate_model_cache, make_forward_batch
    from kernels.conv import causal_conv1d_decode
    from kernels.gdn import gated_delta_rule_decode

    model = _loaded_mtp("dense").model
    config = model.config
    layer = next(m.linear_attn for m in model.model.layers if m.layer_type == "linear_attention")
    width, slots = 4, [0, 1]
    cache = allocate_model_cache(config, 4, 16, num_state_slots=2 + 2 * 3 + 1)
    gen = torch.Generator().manual_seed(0)
    for t in (*cache.conv_state, *cache.recurrent_state):
        t.copy_(torch.randn(t.shape, generator=gen))
    start = [t.clone() for t in (cache.conv_state[0], cache.recurrent_state[0])]
    qkv = torch.randn(2 * width, config.conv_dim, generator=gen)
    a = torch.randn(2 * width, config.linear_num_value_heads, generator=gen)
    b = torch.randn(2 * width, config.linear_num_value_heads, generator=gen)
    batch = make_forward_batch([[1] * width] * 2, [5, 9], [[0, 1], [2, 3]], slots, 16)
    snaps = torch.tensor([[2, 3, 4], [5, 6, 7]])
    from dataclasses import replace

    batch = replace(batch, verify_width=width, snapshot_slots=snaps)
    weight = layer.conv1d.weight.squeeze(1)
    conv, rec = cache.conv_state[0], cache.recurrent_state[0]
    layer._verify(qkv, a, b, weight, conv, rec, batch)
    if accepted < width - 1:
        cache.copy_states(snaps[:, accepted], torch.tensor(slots))
    got = [conv[slots].clone(), rec[slots].clone()]
    conv_ref, rec_ref = start[0].clone(), start[1].clone()
    slot_t, cont = torch.tensor(slots), torch.ones(2, dtype=torch.bool)
    for j in range(accepted + 1):
        mixed = causal_conv1d_decode(qkv[j::width], weight, conv_ref, slot_t, cont)
        q, k, v = layer._heads(mixed)
        gated_delta_rule_decode(
            q, k, v, a[j::width], b[j::width], layer.A_log, layer.dt_bias, rec_ref, slot_t, cont
        )
    assert torch.equal(got[0], conv_ref[slots]) and torch.equal(got[1], rec_ref[slots])


def verify_and_roll_back(model, accepted: list[int], skip: bool) -> tuple[list[torch.Tensor], ...]:
    """A GDN layer's verify pass over W = 4 positions of len(accepted) rows on the model's device, rolled back by the
    one-wait rounds' `roll_back` (engine/runner/spec_round.py: row i's working slot from snapshot accepted[i], or,
    all kept, from itself; `NINFER_ROLLBACK_COPY` as `skip`). Returns (every slot of both stacks after the verify,
    the same after the rollback, each row's working state after decoding its positions 0..accepted one step at a
    time from the same inputs: [conv, recurrent])."""
    from types import SimpleNamespace

    from engine.model.forward import allocate_model_cache, make_forward_batch
    from engine.runner.spec_round import roll_back
    from kernels import _dispatch
    from kernels.conv import causal_conv1d_decode
    from kernels.gdn import gated_delta_rule_decode

    config, dev = model.config, next(model.parameters()).device
    layer = next(m.linear_attn for m in model.model.layers if m.layer_type == "linear_attention")
    n, width = len(accepted), 4
    slots = list(range(n))
    cache = allocate_model_cache(config, 2 * n, 16, n + n * (width - 1), torch.float32, dev)
    gen = torch.Generator().manual_seed(0)
    for t in cache.state_stacks:
        t.copy_(torch.randn(t.shape, generator=gen))
    start = [cache.conv_state[0].clone(), cache.recurrent_state[0].clone()]
    qkv = torch.randn(n * width, config.conv_dim, generator=gen).to(dev)
    a = torch.randn(n * width, config.linear_num_value_heads, generator=gen).to(dev)
    b = torch.randn(n * width, config.linear_num_value_heads, generator=gen).to(dev)
    batch = make_forward_batch([[1] * width] * n, [5] * n, [[2 * i, 2 * i + 1] for i in slots], slots, 16,
                               device=dev)  # fmt: skip
    snap = torch.tensor([n + i * (width - 1) for i in slots], device=dev)
    snaps = snap[:, None] + torch.arange(width - 1, device=dev)
    batch = dataclasses.replace(batch, verify_width=width, snapshot_slots=snaps)
    weight = layer.conv1d.weight.squeeze(1)
    conv, rec = cache.conv_state[0], cache.recurrent_state[0]
    layer._verify(qkv, a, b, weight, conv, rec, batch)
    verified = [t.clone() for t in cache.state_stacks]
    mode = _dispatch.ROLLBACK_COPY
    _dispatch.ROLLBACK_COPY = "skip" if skip else "gather"
    try:
        roll_back(SimpleNamespace(cache=cache), torch.tensor(accepted, device=dev), width, snap,
                  torch.tensor(slots, device=dev))  # fmt: skip
    finally:
        _dispatch.ROLLBACK_COPY = mode
    rolled = [t.clone() for t in cache.state_stacks]
    want = []
    for i, kept in enumerate(accepted):
        conv_ref, rec_ref = start[0][i : i + 1].clone(), start[1][i : i + 1].clone()
        slot_t, cont = torch.tensor([0], device=dev), torch.ones(1, dtype=torch.bool, device=dev)
        for j in range(kept + 1):
            row = i * width + j
            mixed = causal_conv1d_decode(qkv[row : row + 1], weight, conv_ref, slot_t, cont)
            q, k, v = layer._heads(mixed)
            gated_delta_rule_decode(q, k, v, a[row : row + 1], b[row : row + 1], layer.A_log, layer.dt_bias,
                                    rec_ref, slot_t, cont)  # fmt: skip
        want.append([conv_ref[0], rec_ref[0]])
    return verified, rolled, want


@pytest.mark.parametrize("skip", [False, True])
def test_a_row_that_kept_every_draft_keeps_its_state_through_the_rollback(skip):
    """The one-wait rollback over rows that kept every draft (3 of 3), some (1) and none: each working slot is the
    state of decoding the kept positions one step at a time, bit for bit; the all-kept rows' slots are exactly what
    the verify left there (their rollback copies nothing: under `NINFER_ROLLBACK_COPY=skip` on the GPU it moves no
    byte; here the reference runs either way), and only the working slots change."""
    accepted = [3, 1, 0, 3]
    verified, rolled, want = verify_and_roll_back(_loaded_mtp("dense").model, accepted, skip)
    for i, kept in enumerate(accepted):
        for kind in range(2):
            assert torch.equal(rolled[kind][0, i], want[i][kind]), (i, kind)
            if kept == 3:
                assert torch.equal(rolled[kind][:, i], verified[kind][:, i]), (i, kind)
    n = len(accepted)
    for kind in range(2):  # the snapshot slots are read, never written
        assert torch.equal(rolled[kind][:, n:], verified[kind][:, n:])


def test_a_verify_padding_row_reads_and_writes_no_state():
    """A padding row of a verify batch (state slot -1, snapshot slots -1: the static buffers' padding) outputs
    zeros and touches no slot; the real row beside it gets what it gets alone (its working slot and its
    snapshot slots written, nothing else)."""
    from dataclasses import replace

    from engine.model.forward import allocate_model_cache, make_forward_batch

    model = _loaded_mtp("dense").model
    config = model.config
    layer = next(m.linear_attn for m in model.model.layers if m.layer_type == "linear_attention")
    width = 3
    gen = torch.Generator().manual_seed(1)
    qkv = torch.randn(2 * width, config.conv_dim, generator=gen)
    a = torch.randn(2 * width, config.linear_num_value_heads, generator=gen)
    b = torch.randn(2 * width, config.linear_num_value_heads, generator=gen)
    weight = layer.conv1d.weight.squeeze(1)

    def verify(num_rows: int) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """(core, the stacks before, the stacks after) of a verify over the real row (+ a padding row)."""
        cache = allocate_model_cache(config, 4, 16, num_state_slots=6)
        for i, t in enumerate(cache.state_stacks):
            t.copy_(torch.randn(t.shape, generator=torch.Generator().manual_seed(2 + i)))
        before = [t.clone() for t in cache.state_stacks]
        batch = make_forward_batch([[1] * width] * num_rows, [5] * num_rows, [[0, 1]] * num_rows,
                                   [0, 1][:num_rows], 16)  # fmt: skip
        batch = replace(batch, state_slots=torch.tensor([0, -1])[:num_rows], verify_width=width,
                        snapshot_slots=torch.tensor([[2, 3], [-1, -1]])[:num_rows])  # fmt: skip
        t = num_rows * width
        core = layer._verify(
            qkv[:t], a[:t], b[:t], weight, cache.conv_state[0], cache.recurrent_state[0], batch
        )
        return core, before, [t.clone() for t in cache.state_stacks]

    core, before, after = verify(2)
    alone, _, after_alone = verify(1)
    assert torch.all(core[width:] == 0) and torch.equal(core[:width], alone)
    for old, new, new_alone in zip(before, after, after_alone, strict=True):
        assert torch.equal(new, new_alone)
        assert torch.equal(new[:, [1, 4, 5]], old[:, [1, 4, 5]]), "a slot no real row names changed"
        assert not torch.equal(new[0, [0, 2, 3]], old[0, [0, 2, 3]]), "the real row wrote its slots"


def test_copy_states_moves_every_gdn_layer_through_the_stacks():
    """The per-layer state tensors are views of one stack per kind: a copy of slots moves every layer's conv
    and recurrent rows (the rollback), and only the destination slots change."""
    from engine.model.forward import allocate_model_cache

    config = _loaded_mtp("dense").model.config
    cache = allocate_model_cache(config, 4, 16, num_state_slots=6)
    assert len(cache.conv_state) > 1 and len(cache.state_stacks) == 2
    for i, t in enumerate((*cache.conv_state, *cache.recurrent_state)):
        t.copy_(torch.randn(t.shape, generator=torch.Generator().manual_seed(i)))
    before = [t.clone() for t in (*cache.conv_state, *cache.recurrent_state)]
    cache.copy_states(torch.tensor([4, 1]), torch.tensor([0, 5]))
    for t, old in zip((*cache.conv_state, *cache.recurrent_state), before, strict=True):
        assert torch.equal(t[[0, 5]], old[[4, 1]]) and torch.equal(t[1:5], old[1:5])


@pytest.mark.parametrize("arch", ["dense", "moe"])
def test_prefix_reuse_with_spec_equals_cold(arch):
    """Second turns reuse the first turns' checkpoints (one ends on a page boundary: copy-on-write of the
    page holding the MTP pair at L - 1) and still give the plain tokens."""
    first = [prompt(32, 1), prompt(21, 2)]
    params = SamplingParams(temperature=0.0, max_tokens=8)
    plain = make_core(arch, page_size=16, max_concurrency=2)
    out1 = run(plain, first, params)[0]
    second = [p + o + prompt(9, 3 + i) for i, (p, o) in enumerate(zip(first, out1, strict=True))]
    second.append(first[0][:16] + prompt(5, 9))  # a hit of exactly one full page
    want = make_core(arch, prefix_reuse=False)
    expected = [run(want, [s], params)[0][0] for s in second]
    for k in (1, 4):
        core = spec_core(arch, k, page_size=16, max_concurrency=2)
        assert run(core, first, params)[0] == out1
        got, finish = run(core, second, params)
        assert got == expected, f"k={k}"
        assert sum(f.num_cached_tokens for f in finish.values()) > 0, "no prefix was reused"


def test_host_parking_with_spec_equals_plain():
    """Checkpoints evicted to host RAM and restored (pages incl. the MTP KV, GDN state) keep the tokens."""
    params = SamplingParams(temperature=0.0, max_tokens=6)
    turns = [prompt(40, s) for s in range(4)]
    plain = make_core("dense", prefix_reuse=False)
    expected = [run(plain, [t], params)[0][0] for t in turns]
    core = spec_core("dense", 2, max_checkpoints=1, max_boundary_saves=0, host_kv_cache_mib=8)
    for t, e in zip(turns, expected, strict=True):
        assert run(core, [t], params)[0][0] == e
    for t, e in zip(turns, expected, strict=True):  # again: restored from the host
        assert run(core, [t + e], params)[0][0] == run(plain, [t + e], params)[0][0]
    assert core.stats().host_kv_restores > 0


def _recorded_drafts(core: EngineCore) -> list[tuple[str, tuple[int, ...]]]:
    """Every proposal the real drafter makes, in order (request id, draft tokens)."""
    spec = core.runner.spec
    assert spec is not None
    real, log = spec.run, []

    def run_step(rows, history, plain_sample):  # every round's drafts (the one-wait round's too)
        out = real(rows, history, plain_sample)
        log.extend((row.request_id, d) for row, d in zip(rows, out.drafts, strict=True) if d)
        return out

    spec.run = run_step  # type: ignore[method-assign]
    return log


def test_a_host_restored_session_drafts_like_a_device_checkpoint():
    """The MTP continuation hidden state is parked and restored with the slot's GDN state (cache slot extras):
    a session restored from host RAM proposes exactly the drafts of the same session resumed from a device
    checkpoint (a stale hidden state would change the MTP KV at the resume point and the drafts after it),
    and the greedy tokens stay the plain ones. The parked checkpoint's bytes count the hidden state."""
    params = SamplingParams(temperature=0.0, max_tokens=6)
    turns = [prompt(40, s) for s in range(3)]
    parked = spec_core("dense", 2, max_checkpoints=1, max_boundary_saves=0, host_kv_cache_mib=8)
    resident = spec_core("dense", 2, max_checkpoints=8, max_boundary_saves=0)
    first = [run(parked, [t], params)[0][0] for t in turns]
    assert first == [run(resident, [t], params)[0][0] for t in turns]
    logs = [_recorded_drafts(parked), _recorded_drafts(resident)]
    second = [t + o + prompt(7, 10 + i) for i, (t, o) in enumerate(zip(turns, first, strict=True))]
    plain = make_core("dense", prefix_reuse=False)
    for turn in second:  # each resumes turn i's checkpoint: from host RAM, and from the device
        got_parked, finish_parked = run(parked, [turn], params)
        got_resident, finish_resident = run(resident, [turn], params)
        assert got_parked == got_resident == run(plain, [turn], params)[0]
        cached = [next(iter(f.values())).num_cached_tokens for f in (finish_parked, finish_resident)]
        assert cached[0] == cached[1] > 0, cached
    assert parked.stats().host_kv_restores >= 2 and resident.stats().host_kv_restores == 0
    assert logs[0] == logs[1] and logs[0], "the restored session drafted differently"
    assert parked.host is not None
    hidden = parked.model_config.hidden_size * 4  # float32 rows
    gdn = sum(t[0].numel() * t.element_size() for t in (*parked.runner.cache.conv_state,
                                                         *parked.runner.cache.recurrent_state))  # fmt: skip
    assert parked.host.geometry.bytes_per_checkpoint == gdn + hidden


def test_sampled_spec_is_reproducible_with_a_seed():
    params = SamplingParams(temperature=0.9, top_p=0.9, seed=3, max_tokens=12)
    p = [prompt(10, 1)]
    a = run(spec_core("dense", 3), p, params)[0]
    b = run(spec_core("dense", 3), p, params)[0]
    assert a == b and len(a[0]) == 12


def test_round_statistics_per_request_and_in_engine_stats():
    """Oracle drafts right for 2 of 3 per round: every round accepts 2, positions 0 and 1 count each round."""
    want = _baseline("dense", tuple(LENGTHS), PARAMS.max_tokens)
    core = spec_core("dense", 3, max_concurrency=3)
    _oracle(core, {f"r{i}": w for i, w in enumerate(want)}, lambda _r, _n: 2)
    got, finish = run(core, [prompt(n, s) for s, n in enumerate(LENGTHS)], PARAMS)
    assert got == want
    per_request = [finish[f"r{i}"].speculative for i in range(3)]
    assert all(s is not None for s in per_request)
    stats = core.stats()
    assert stats.spec_method == "mtp" and stats.spec_draft_tokens == 3
    assert stats.spec_rounds == sum(s.rounds for s in per_request) > 0
    assert stats.spec_accepted_tokens == sum(s.accepted_tokens for s in per_request)
    for s in per_request:
        assert s.accepted_per_position[:2] == (s.rounds, s.rounds) and s.accepted_per_position[2] == 0
        assert s.accepted_tokens == 2 * s.rounds and s.tokens_per_round == 3.0
        # 13 tokens after the first: rounds of 3, then the length limit leaves room for fewer drafts
        assert s.rounds + s.fallback_steps >= 4
    plain = make_core("dense")
    assert plain.stats().spec_rounds == 0 and run(plain, [prompt(5, 0)], PARAMS)[1]["r0"].speculative is None


@pytest.mark.parametrize("arch", ["dense", "moe"])
def test_speculative_engine_warms_up_with_overlap_on(arch: str, caplog: pytest.LogCaptureFixture) -> None:
    """A speculative engine's warm-up runs plain steps with a penalized sampled row while overlap is on (the
    CUDA default): its penalties come from the host history, not the device counts a plain engine keeps. On
    the H200 this crashed every `--spec mtp` start (an assertion on the missing device counts)."""
    cold = spec_core(arch, 2, max_concurrency=4)
    with caplog.at_level(logging.INFO, logger="engine.core"):
        warm = spec_core(arch, 2, max_concurrency=4, warmup=True, overlap=True, prefill_chunk=96)
    assert warm.warmup is not None and warm.warmup.steps == 4
    assert (
        not warm.overlap and "overlap scheduling is off under --spec mtp" in caplog.text
    )  # said, not silent
    prompts = [prompt(n, seed) for seed, n in enumerate((7, 40, 3, 66))]
    assert run(warm, prompts, GREEDY)[0] == run(cold, prompts, GREEDY)[0]
