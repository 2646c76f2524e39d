"""The grammar masks computed ahead in the worker thread (engine/structured/matchers.py, `overlap=True`) give
exactly the tokens of the synchronous path (`overlap=False`): on random logits step by step, with rows that
reorder, close their reasoning and open a triggered call (end to end on a random-weight model:
tests/engine/test_structured.py; on CUDA with graph decode: the gpu test here)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from engine_harness import prompt, run, tiny_artifact

from engine import SamplingParams
from engine.config import EngineConfig
from engine.core import EngineCore, load_artifact
from engine.sampling import Sampler
from engine.structured import ToolDef, json_schema_spec, tool_call_spec
from engine.structured.compiler import GrammarCompiler
from engine.tokenizer import qwen35_tokenizer

VOCAB = 248320
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "n": {"type": "integer", "maximum": 99}},
    "required": ["name", "n"],
    "additionalProperties": False,
}
TOOL = ToolDef(
    "lookup",
    {
        "type": "object",
        "properties": {"q": {"type": "integer"}},
        "required": ["q"],
        "additionalProperties": False,
    },
    strict=True,
)


def _specs():
    json_spec = json_schema_spec(SCHEMA, strict=True)
    return [
        json_spec,
        None,
        replace(tool_call_spec([TOOL], parallel=False, forced=False), in_reasoning=True),
        tool_call_spec([TOOL], parallel=True, forced=True),
        replace(json_spec, in_reasoning=True),
    ]


def _random_logit_run(compiler: GrammarCompiler, overlap: bool, steps: int = 30):
    sampler = Sampler("cpu", 0, compiler)
    assert sampler.grammars is not None
    sampler.grammars.overlap = overlap
    specs = _specs()
    params = [
        SamplingParams(temperature=1.0 if i == 0 else 0.0, top_k=20, seed=i, structured=s)
        for i, s in enumerate(specs)
    ]
    ids = [f"r{i}" for i in range(len(specs))]
    gen = torch.Generator().manual_seed(7)
    tok = compiler.tokenizer
    think_end, trigger = tok.token_to_id("</think>"), tok.token_to_id("<tool_call>")
    history = []
    for step in range(steps):
        logits = torch.randn(len(specs), VOCAB, generator=gen) * 3
        if step == 3:  # the reasoning rows close their reasoning, then one opens a call
            logits[2, think_end] = logits[4, think_end] = 1e4
        if step == 6:
            logits[2, trigger] = 1e4
        order = list(range(len(specs))) if step % 5 else list(reversed(range(len(specs))))  # rows reorder
        tokens = sampler.sample(logits[order], [params[i] for i in order], [ids[i] for i in order]).tolist()
        sampler.commit([ids[i] for i in order], tokens)
        history.append(tokens)
    rows = sampler.grammars
    rows.settle()
    return history, rows.num_precomputed, rows.num_computed_inline


def test_overlapped_masks_sample_the_same_tokens_as_the_synchronous_path():
    compiler = GrammarCompiler(qwen35_tokenizer(), VOCAB)
    sync, sync_ahead, sync_inline = _random_logit_run(compiler, overlap=False)
    ahead, ahead_count, ahead_inline = _random_logit_run(compiler, overlap=True)
    assert ahead == sync
    assert sync_ahead == 0 and sync_inline > 0
    assert ahead_count > ahead_inline > 0  # most rows came from the worker; reordered steps recompute


@pytest.mark.gpu
def test_overlapped_masks_match_the_synchronous_path_on_cuda_graph_decode():
    """On the device: pinned double buffers, non-blocking copies and the fused kernel, batched over 8 lanes."""
    assert torch.cuda.is_available(), "the gpu marker needs a CUDA device"
    art = load_artifact(tiny_artifact("dense"), device="cuda", dtype=torch.float32)
    flags = dict(max_context=512, max_concurrency=8, prefill_chunk_multiple=1, prefix_reuse=False)
    core = EngineCore(art.model, art.tokenizer, EngineConfig.from_flags(**flags))
    assert core.runner.graphs_captured
    spec = json_schema_spec(SCHEMA, strict=True)
    params = SamplingParams(temperature=1.0, top_p=0.95, top_k=20, seed=3, max_tokens=120, structured=spec)
    items = [prompt(20 + i, i) for i in range(8)]
    rows = core.runner.sampler.grammars
    assert rows is not None
    outs = {}
    for overlap in (False, True):
        rows.overlap = overlap
        rows.num_precomputed = rows.num_computed_inline = 0
        outs[overlap], _ = run(core, items, params, check=False)
    assert outs[True] == outs[False]
    assert rows.num_precomputed > rows.num_computed_inline
