"""`--spec dflash` through the real engine on the tiny MoE model with a tiny DFlash companion (float32, CPU):
greedy output equals the non-speculative output for K in {1, 4, 15}, alone and batched, with prefix reuse on;
the drafter's proposals are those of the companion computed directly (paged context KV, catch-up across
prefill chunks, a window shorter than the prompts); a prefix hit drafts what a cold run drafts (shared pages
carry the context KV); statistics name the drafter; targets without a companion, dense targets and bad K
are refused with the reason.

The artifact is the shared tiny MoE one (engine_harness) rewritten with the companion's tensors (no new
random draw of the target), loaded once for the module.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from engine_harness import _root, agreeing_drafts, one_thread, prompt, run, tiny_artifact, tiny_loaded

from engine.artifact.container import read_artifact, write_artifact
from engine.config import EngineConfig
from engine.core import EngineCore, load_artifact
from engine.model.forward import allocate_model_cache, make_forward_batch
from engine.request import SamplingParams
from engine.runner import ModelRunner
from engine.spec.dflash_draft import dflash_of
from engine.testing.tiny_dflash import TINY_DFLASH, tiny_dflash_resource, tiny_dflash_tensors

LENGTHS = [5, 17, 40]  # the tiny companion's window is 8: the longer prompts run past it


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


@functools.cache
def dflash_artifact() -> Path:
    """The tiny MoE artifact plus the tiny companion (`build-tiny --arch moe --dflash` writes the same)."""
    source = read_artifact(tiny_artifact("moe"))
    tensors = [(n, source.tensor(n)) for n in source.tensor_names()] + tiny_dflash_tensors(TINY_DFLASH, 0)
    resources = [(n, source.resource(n)) for n in source.resource_names()] + [
        tiny_dflash_resource(TINY_DFLASH)
    ]
    return write_artifact(
        _root() / "tiny-moe-dflash.ninfer",
        model_id=source.model_id,
        weights_id=source.weights_id,
        tensors=tensors,
        resources=resources,
    )


@functools.cache
def _loaded():
    return load_artifact(dflash_artifact(), device="cpu", dtype=torch.float32, with_dflash=True)


def core(k: int | None, **flags) -> EngineCore:
    flags.setdefault("max_context", 512)
    flags.setdefault("prefill_chunk_multiple", 1)
    spec = {"spec": "dflash", "draft_tokens": k} if k is not None else {}
    loaded = _loaded()
    return EngineCore(loaded.model, loaded.tokenizer, EngineConfig.from_flags(**spec, **flags), seed=0)


@functools.cache
def _baseline(max_tokens: int) -> list[list[int]]:
    plain = core(None, prefix_reuse=False, max_concurrency=len(LENGTHS))
    return run(
        plain,
        [prompt(n, s) for s, n in enumerate(LENGTHS)],
        SamplingParams(temperature=0.0, max_tokens=max_tokens),
    )[0]


def _record(engine: EngineCore) -> list[tuple[str, tuple[int, ...]]]:
    """Every proposal the DFlash drafter makes, in order (eager blocks and blocks on the static buffers both turn
    their hidden states into proposals through `DFlashDrafter.proposals`)."""
    spec = engine.runner.spec
    assert spec is not None
    real, seen = spec.drafter.proposals, []

    def proposals(rows, hidden):
        out = real(rows, hidden)
        seen.extend((r.request_id, p.tokens) for r, p in zip(rows, out, strict=True) if p.tokens)
        return out

    spec.drafter.proposals = proposals  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("k", [1, 4, 15])
def test_greedy_dflash_equals_plain_alone_and_batched(k):
    """K=15 runs 17 new tokens, so its first round drafts a full block (the length limit shrinks later ones); the
    others 10 (greedy output of a shorter limit is a prefix of the longer one's)."""
    params = SamplingParams(temperature=0.0, max_tokens=17 if k == 15 else 10)
    want = [w[: params.max_tokens] for w in _baseline(17)]
    prompts = [prompt(n, s) for s, n in enumerate(LENGTHS)]
    alone = core(k)  # C=1, prefix reuse on (the default)
    assert run(alone, [prompts[1]], params)[0][0] == want[1]
    batched = core(k, max_concurrency=3, prefill_chunk=16)
    proposals = _record(batched)
    assert run(batched, prompts, params)[0] == want
    stats = batched.scheduler.spec_stats
    assert stats.method == "dflash" and stats.rounds > 0 and stats.drafted >= stats.rounds
    assert max(len(t) for _, t in proposals) == k  # full blocks were drafted


def test_drafts_that_always_agree_commit_k_plus_one_per_round():
    """The acceptance path: every round's proposals (the general round's and the one-wait rounds', which draw on the
    device: these greedy rows carry the model's default presence penalty, so they take the sampled one) replaced by
    the true continuation."""
    k, params = 4, SamplingParams(temperature=0.0, max_tokens=17)
    want = dict(zip(["r0", "r1", "r2"], _baseline(17), strict=True))
    engine = core(k, max_concurrency=3)
    spec = engine.runner.spec
    assert spec is not None
    agreeing_drafts(spec, want)
    got = run(engine, [prompt(n, s) for s, n in enumerate(LENGTHS)], params)[0]
    assert got == list(want.values())
    stats = engine.scheduler.spec_stats
    assert stats.accepted == stats.drafted > 0 and stats.accepted_per_position[0] == stats.rounds
    # every round commits its drafts + 1: 16 tokens after the first take ceil(16 / 5) rounds per request,
    # the last ones shortened by the length limit
    assert stats.rounds + stats.fallbacks <= 3 * -(-(params.max_tokens - 1) // (k + 1))


def test_proposals_are_the_companions_own_block_forward():
    """Round one of a chunked prefill (3 chunks, past the window): the engine's drafts are the argmax of the
    companion run directly on the prompt's features, outside any page."""
    k, n = 6, 40
    ids = prompt(n, 9)
    engine = core(k, prefill_chunk=16)
    proposals = _record(engine)
    run(engine, [ids], SamplingParams(temperature=0.0, max_tokens=3))
    model = _loaded().model
    cache = allocate_model_cache(model.config, num_pages=2, page_size=64, dtype=torch.float32)
    with torch.inference_mode():
        hidden, features = model.forward_features(
            make_forward_batch([ids], [0], [[0, 1]], [0]), cache, TINY_DFLASH.target_layer_ids
        )
        first_token = int(model.compute_logits(hidden[-1:]).argmax())
        draft = dflash_of(model)
        kv = draft.context_kv(features, torch.arange(n))
        block = torch.tensor([[first_token] + [TINY_DFLASH.mask_token_id] * k])

        def context(layer):
            pos = torch.arange(n)[None]
            return kv[layer][0][None], kv[layer][1][None], pos, torch.ones_like(pos, dtype=torch.bool)

        out = draft.forward_block(model.model.embed_tokens(block), n + torch.arange(k + 1)[None], context)
        want = model.compute_logits(out[0, 1:]).argmax(dim=-1).tolist()
    assert proposals[0] == ("r0", tuple(want))


def test_prefix_hit_drafts_what_a_cold_run_drafts():
    """Second turns reuse the first turns' pages (context KV included; one hit is exactly one full page, copied
    on write): tokens and every round's drafts equal a cold run's."""
    params = SamplingParams(temperature=0.0, max_tokens=8)
    first = [prompt(32, 1), prompt(21, 2)]
    warm = core(3, page_size=16, max_concurrency=2)
    out1 = run(warm, first, params)[0]
    second = [p + o + prompt(9, 3 + i) for i, (p, o) in enumerate(zip(first, out1, strict=True))]
    second.append(first[0][:16] + prompt(5, 9))
    cold = core(3, page_size=16, prefix_reuse=False)
    cold_drafts = _record(cold)
    warm_drafts = _record(warm)
    reused = 0
    for turn in second:
        want = run(cold, [turn], params)[0]
        got, finish = run(warm, [turn], params)
        assert got == want
        reused += sum(f.num_cached_tokens for f in finish.values())
    assert reused > 0, "no prefix was reused"
    assert [t for _, t in warm_drafts] == [t for _, t in cold_drafts]


def test_sampled_dflash_is_seeded_and_statistics_name_the_drafter():
    """Sampled rows draft from the companion's processed q (rejection sampling needs it): a seeded request
    gives the same tokens twice."""
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=5, max_tokens=8)
    again, _ = run(core(2), [prompt(12, 1)], params)
    engine = core(2)
    got, finish = run(engine, [prompt(12, 1)], params)
    assert got == again and len(got[0]) == params.max_tokens
    spec = next(iter(finish.values())).speculative
    assert spec is not None and spec.backend == "dflash" and spec.draft_window == 2 and spec.rounds > 0
    assert engine.stats().spec_method == "dflash" and engine.stats().spec_rounds == spec.rounds


def test_targets_that_cannot_host_dflash_are_refused():
    with pytest.raises(ValueError, match="carries no DFlash companion"):
        load_artifact(tiny_artifact("dense"), device="cpu", dtype=torch.float32, with_dflash=True)
    dense = tiny_loaded("dense")
    with pytest.raises(ValueError, match="loaded without its DFlash companion"):
        ModelRunner(
            dense.model, num_pages=4, page_size=64, num_state_slots=1, spec="dflash", num_draft_tokens=2
        )
    from engine.spec.dflash_draft import attach_dflash

    with pytest.raises(ValueError, match="DFlash drafts for the Qwen3.6-35B-A3B \\(MoE\\) target only"):
        attach_dflash(dense.model, dflash_of(_loaded().model))
    from engine.testing.synthetic import load_synthetic

    with pytest.raises(ValueError, match="this model is dense"):
        load_synthetic("tiny-dense", device="cpu", with_dflash=True)
    with pytest.raises(ValueError, match="draft_tokens=16: must be in 1..15 with --spec dflash"):
        EngineConfig.from_flags(spec="dflash", draft_tokens=16)


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["--synthetic", "qwen3.6-27b", "--spec", "dflash", "--spec-rounds", "3"], "this model is dense"),
        (
            ["--synthetic", "qwen3.6-35b-a3b", "--spec", "dflash", "--spec-rounds", "16"],
            "draft_tokens=16: must be in 1..15 with --spec dflash",
        ),
    ],
)
def test_bench_refuses_dflash_rounds_it_cannot_run(argv, reason, capsys):
    from engine.testing.bench.cli import main

    assert main(argv) == 2
    assert reason in capsys.readouterr().err


def test_llm_entry_point_runs_dflash():
    """`LLM(spec="dflash", draft_tokens=K)` loads the companion from the artifact and keeps the greedy tokens."""
    from engine import LLM

    llm = LLM(
        dflash_artifact(), device="cpu", dtype=torch.float32, max_context=512, spec="dflash", draft_tokens=3
    )
    out = llm.generate(
        {"prompt_token_ids": prompt(LENGTHS[1], 1)}, SamplingParams(temperature=0.0, max_tokens=8)
    )
    assert list(out[0].token_ids) == _baseline(17)[1][:8]
    assert llm.core.scheduler.spec_stats.rounds > 0


def test_build_tiny_offers_the_companion_for_the_moe_layout_only(tmp_path, capsys):
    from engine.artifact.cli import main

    assert main(["build-tiny", str(tmp_path / "x.ninfer"), "--dflash"]) == 2
    assert "--dflash needs --arch moe" in capsys.readouterr().err
    assert not (tmp_path / "x.ninfer").exists()
