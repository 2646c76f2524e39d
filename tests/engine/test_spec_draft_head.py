"""`--lm-head-draft` (engine/spec/draft_head.py): a tiny model converted with a frequency list carries the
reduced output head; with the flag the MTP drafts come only from its shortlist, verification keeps the full
head (greedy output = the plain output); without such a head the flag is refused with the reason."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
from engine_harness import one_thread, prompt, run, tiny_artifact
from safetensors.torch import save_file
from test_spec_engine import _loaded_mtp

from engine.artifact.cli import main as artifact_cli
from engine.artifact.container import ArtifactError, read_artifact
from engine.config import EngineConfig
from engine.core import EngineCore, load_artifact
from engine.request import SamplingParams
from engine.spec.draft_head import DRAFT_ROWS, build_draft_head, draft_head_of, read_frequency_list

RANKING = [149_999, 1_234, 77_777, 1_234, 5, *range(120_000, 120_400)]  # a repeat, kept once


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


@functools.cache
def _converted(root: Path) -> Path:
    """The tiny dense artifact written out as an HF checkpoint directory, converted with a frequency list."""
    source = read_artifact(tiny_artifact("dense"))
    hf = root / "hf"
    hf.mkdir()
    save_file({n: source.tensor(n).clone() for n in source.tensor_names()}, str(hf / "model.safetensors"))
    for name in source.resource_names():
        (hf / name).write_bytes(source.resource(name))
    freq = root / "freq.json"
    freq.write_text(json.dumps(RANKING))
    out = root / "tiny-draft-head.ninfer"
    argv = ["convert", str(hf), str(out), "--model-id", "ninfer-tiny-dense", "--weights-id", "bf16"]
    assert artifact_cli([*argv, "--draft-head-frequencies", str(freq)]) == 0
    return out


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _converted(tmp_path_factory.mktemp("draft_head"))


def test_spec_with_the_reduced_head_drafts_from_its_shortlist_and_keeps_the_plain_output(converted):
    loaded = load_artifact(converted, device="cpu", dtype=torch.float32, with_mtp=True, lm_head_draft=True)
    head = draft_head_of(loaded.model)
    assert head is not None and head.num_rows == DRAFT_ROWS
    ids = head.token_ids.tolist()
    assert ids[:5] == [149_999, 1_234, 77_777, 5, 120_000] and len(set(ids)) == DRAFT_ROWS
    shortlist = set(ids)
    params = SamplingParams(temperature=0.0, max_tokens=10)
    prompts = [prompt(n, s) for s, n in enumerate((6, 19, 33))]

    def core(**flags) -> EngineCore:
        config = EngineConfig.from_flags(
            max_context=512, prefill_chunk_multiple=1, max_concurrency=3, **flags
        )
        return EngineCore(loaded.model, loaded.tokenizer, config, seed=0)

    plain = run(core(prefix_reuse=False), prompts, params)[0]
    spec = core(spec="mtp", draft_tokens=3, lm_head_draft=True)
    assert spec.runner.spec is not None
    executor = spec.runner.spec
    real, drafts = executor.run, []

    def run_step(rows, history, plain_sample):  # every round's drafts (the one-wait round's too)
        out = real(rows, history, plain_sample)
        drafts.extend(t for d in out.drafts for t in d)
        return out

    executor.run = run_step  # type: ignore[method-assign]
    assert run(spec, prompts, params)[0] == plain
    assert len(drafts) >= 20 and set(drafts) <= shortlist, "a draft outside the reduced head's shortlist"
    # the full head would have proposed outside the shortlist (the check above has power)
    full = loaded.model.compute_logits(torch.randn(64, loaded.model.config.hidden_size)).argmax(-1).tolist()
    assert not set(full) <= shortlist


def test_lm_head_draft_is_refused_without_a_reduced_head():
    with pytest.raises(ArtifactError, match="carries no reduced output head.*draft-head-frequencies"):
        load_artifact(tiny_artifact("dense"), device="cpu", with_mtp=True, lm_head_draft=True)
    loaded = _loaded_mtp("dense")  # the spec tests' model (no reduced head)
    config = EngineConfig.from_flags(max_context=256, spec="mtp", lm_head_draft=True)
    with pytest.raises(ValueError, match="without a reduced output head"):
        EngineCore(loaded.model, loaded.tokenizer, config)
    with pytest.raises(ValueError, match="needs --spec mtp"):
        EngineConfig.from_flags(lm_head_draft=True)


def test_build_draft_head_and_frequency_lists(tmp_path):
    head = torch.arange(12.0).view(6, 2)
    weight, ids = build_draft_head(head, [4, 1, 4], rows=4)
    assert ids.tolist() == [4, 1, 0, 2] and ids.dtype == torch.int32  # unlisted ids fill in id order
    assert torch.equal(weight, head[[4, 1, 0, 2]])
    with pytest.raises(ArtifactError, match="outside the vocabulary"):
        build_draft_head(head, [6])
    text = tmp_path / "freq.txt"
    text.write_text("# most frequent first\n3 9\n7\n")
    assert read_frequency_list(text) == [3, 9, 7]
    bad = tmp_path / "bad.json"
    bad.write_text('{"token_ids": []}')
    with pytest.raises(ArtifactError, match="non-empty list"):
        read_frequency_list(bad)


def test_the_bench_random_head_proposes_only_its_shortlist():
    """`ninfer-bench --spec-lm-head-draft`'s random head: proposal logits are -inf outside its rows."""
    from torch import nn

    from engine.model.config import ModelConfig
    from engine.spec.draft_head import proposal_logits
    from engine.testing.bench.spec import attach_random_draft_head
    from engine.testing.tiny import tiny_hf_config

    class Stub(nn.Module):  # what the head needs of a model: its config, device and dtype
        def __init__(self) -> None:
            super().__init__()
            self.config = ModelConfig.from_hf(tiny_hf_config("dense"))
            self.anchor = nn.Parameter(torch.zeros(1), requires_grad=False)

    model = Stub()
    attach_random_draft_head(model, rows=1000)  # type: ignore[arg-type]
    head = draft_head_of(model)  # type: ignore[arg-type]
    assert head is not None and head.num_rows == 1000
    logits = proposal_logits(model, torch.randn(3, model.config.hidden_size))  # type: ignore[arg-type]
    finite = torch.isfinite(logits)
    assert finite.sum(dim=1).tolist() == [1000] * 3
    assert set(finite[0].nonzero().flatten().tolist()) == set(head.token_ids.tolist())
