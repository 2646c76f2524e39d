"""Grammar-constrained decoding: the bitmask, the phases, schema refusals with paths, and outputs that are
valid against their schema on random logits and on a random-weight model (the grammar guarantees it)."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import jsonschema
import pytest
import torch
from engine_harness import one_thread, tiny_artifact

from engine import LLM, SamplingParams
from engine.chat.parse import parse_output
from engine.sampling import Sampler, apply_token_bitmask_, token_logprobs
from engine.structured import (
    StructuredError,
    ToolDef,
    check_schema,
    json_object_spec,
    json_schema_spec,
    tool_call_spec,
)
from engine.structured.compiler import GrammarCompiler
from engine.tokenizer import qwen35_tokenizer

VOCAB = 248320  # the Qwen3.5 models' logits width
SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
    },
    "required": ["color", "count", "ok", "tags"],
    "additionalProperties": False,
}
WEATHER = ToolDef(
    "get_weather",
    {
        "type": "object",
        "properties": {
            "days": {"type": "integer", "minimum": 1, "maximum": 9},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["days", "unit"],
        "additionalProperties": False,
    },
    strict=True,
)
TOOLS = [{"type": "function", "function": {"name": WEATHER.name, "parameters": WEATHER.parameters}}]


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    return GrammarCompiler(qwen35_tokenizer(), VOCAB)


def _decode(compiler: GrammarCompiler, specs, steps: int = 400, seed: int = 0) -> list[list[int]]:
    """Sample every row on random logits (a stand-in for a random model) until each ends its turn."""
    sampler = Sampler("cpu", seed, compiler)
    params = [SamplingParams(temperature=0.0, structured=s) for s in specs]  # greedy on random logits
    ids = [f"r{i}" for i in range(len(specs))]
    outputs: list[list[int]] = [[] for _ in specs]
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        tokens = sampler.sample(torch.randn(len(specs), VOCAB, generator=gen) * 4, params, ids).tolist()
        sampler.commit(ids, tokens)
        for out, token in zip(outputs, tokens, strict=True):
            if not out or out[-1] not in compiler.eos_token_ids:
                out.append(token)
        if all(out and out[-1] in compiler.eos_token_ids for out, s in zip(outputs, specs, strict=True) if s):
            break
    sampler.release(ids)
    assert sampler.grammars is not None and len(sampler.grammars) == 0
    return outputs


def _text(compiler: GrammarCompiler, ids: list[int]) -> str:
    return compiler.tokenizer.decode(ids, skip_special_tokens=True)


def test_bitmask_sets_forbidden_logits_to_minus_inf_like_a_per_token_loop():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 70, generator=gen)
    mask = torch.randint(-(2**31), 2**31 - 1, (3, 3), dtype=torch.int32, generator=gen)
    expect = logits.clone()
    for row in range(3):
        for token in range(70):
            if not (int(mask[row, token // 32]) >> (token % 32)) & 1:
                expect[row, token] = float("-inf")
    assert torch.equal(apply_token_bitmask_(logits, mask), expect)


def test_json_schema_outputs_are_valid_on_random_logits_beside_a_free_row(compiler):
    outputs = _decode(compiler, [json_schema_spec(SCHEMA, strict=True), None], steps=300)
    jsonschema.validate(json.loads(_text(compiler, outputs[0])), SCHEMA)
    assert len(outputs[1]) == len(outputs[0])  # the free row ran beside it, unconstrained
    with pytest.raises(ValueError):
        json.loads(_text(compiler, outputs[1]))


def test_json_object_accepts_an_object_and_refuses_an_array(compiler):
    spec = json_object_spec()
    matcher = compiler.matcher(spec)
    assert matcher.consume_tokens(compiler.tokenizer.encode('\n\n{"a": [1, {"b": null}]}'))
    assert matcher.is_accepting()
    assert not compiler.matcher(spec).consume_tokens(compiler.tokenizer.encode("[1]"))


def test_forced_tool_call_is_one_well_formed_call_with_schema_valid_arguments(compiler):
    for parallel in (False, True):
        spec = tool_call_spec([WEATHER], parallel=parallel, forced=True)
        out = _text(compiler, _decode(compiler, [spec], seed=3)[0])
        parsed = parse_output(out, TOOLS)
        assert parsed.content == "" and parsed.tool_calls, out
        assert len(parsed.tool_calls) == 1 or parallel
        for call in parsed.tool_calls:
            assert call.name == "get_weather"
            jsonschema.validate(call.arguments, WEATHER.parameters)


def _allowed(mask: tuple[list[int], torch.Tensor] | None, token: int) -> bool:
    return mask is None or bool((int(mask[1][0, token // 32]) >> (token % 32)) & 1)


def test_phases_reasoning_free_text_then_a_triggered_call_then_only_the_end(compiler):
    tok = compiler.tokenizer
    spec = tool_call_spec([WEATHER], parallel=False, forced=False)
    spec = replace(spec, in_reasoning=True)
    sampler = Sampler("cpu", 0, compiler)
    rows = sampler.grammars
    assert rows is not None
    text = tok.encode("hmm</think>\n\nSure.")
    call = tok.encode(
        "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n"
        "<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>"
    )
    free = tok.encode(" free")[0]
    masks = []
    for token in [*text, *call]:
        masks.append(rows.bitmask([spec], ["x"]))
        assert _allowed(masks[-1], token), tok.decode([token])
        rows.commit(["x"], [token])
    assert all(m is None for m in masks[: len(text) + 1])  # reasoning and text are free: no mask at all
    assert not _allowed(masks[len(text) + 1], free)  # inside the call: the grammar decides
    end = rows.bitmask([spec], ["x"])  # one call allowed (parallel_tool_calls=false): only the end of turn
    assert end is not None and not _allowed(end, free) and _allowed(end, compiler.eos_token_ids[0])


def test_compiled_grammars_are_cached_by_grammar_text(compiler):
    before = compiler.num_cached()
    schema = {"type": "object", "properties": {"cache_probe": {"type": "integer"}}}
    for _ in range(3):
        compiler.check(json_schema_spec(schema, strict=True))
    assert compiler.num_cached() == before + 1


@pytest.mark.parametrize(
    ("schema", "path", "words"),
    [
        ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "#/properties/a/not", "not"),
        ({"type": "object", "properties": {"a": {"type": "strin"}}}, "#/properties/a/type", "unknown type"),
        ({"properties": {"a": {"$ref": "#/$defs/missing"}}}, "#/properties/a/$ref", "does not point"),
        ({"properties": {"a": {"enum": list(range(5000))}}}, "#/properties/a/enum", "at most"),
        ({"properties": {"a": {"type": "string", "pattern": "a(?=b)"}}}, "#/properties/a/pattern", "pattern"),
    ],
)
def test_bad_schemas_are_refused_fast_with_their_path(compiler, schema, path, words):
    started = time.perf_counter()
    with pytest.raises(StructuredError) as info:
        check_schema(schema, param="response_format", strict=True, regex_error=compiler.regex_error)
    assert info.value.path == path and words in str(info.value)
    assert time.perf_counter() - started < 2.0


def test_deep_nesting_is_refused_and_unsupported_keywords_pass_when_not_strict(compiler):
    deep: dict = {"type": "integer"}
    for _ in range(40):
        deep = {"type": "array", "items": deep}
    with pytest.raises(StructuredError, match="deeper than"):
        check_schema(deep, param="response_format", strict=True)
    loose = {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}
    check_schema(loose, param="response_format", strict=False)
    compiler.check(json_schema_spec(loose, strict=False))
    with pytest.raises(StructuredError):
        compiler.check(
            json_schema_spec({"type": "object", "properties": {"a": {"uniqueItems": True}}}, strict=True)
        )


@pytest.fixture(scope="module")
def llm():
    with one_thread():
        yield LLM(tiny_artifact("dense"), max_context=512, max_concurrency=3, device="cpu")


def test_random_weight_model_answers_valid_json_batched_with_a_free_request(llm):
    spec = json_schema_spec(SCHEMA, strict=True)
    prompts = ["Describe a colour", "Another", "Free text here"]
    params = [
        SamplingParams(temperature=1.0, seed=5, max_tokens=300, structured=spec),
        SamplingParams(temperature=0.0, max_tokens=300, structured=spec),
        SamplingParams(temperature=0.0, max_tokens=8),
    ]
    with one_thread():
        outs = llm.generate(prompts, params)
    for out in outs[:2]:
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), SCHEMA)
    free = llm.generate(prompts[2], params[2])[0]
    assert free.token_ids == outs[2].token_ids  # a constrained neighbour changes nothing for a free row


def test_token_logprobs_are_the_raw_log_softmax_with_the_best_alternatives():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 50, generator=gen)
    found = token_logprobs(logits, [7, 8, 9], [2, None, 0])
    expect = logits.log_softmax(-1)
    assert found[1] is None and found[2] is not None and found[2].top == ()
    first = found[0]
    assert first is not None and first.token_id == 7 and abs(first.logprob - float(expect[0, 7])) < 1e-6
    best = expect[0].topk(2)
    assert [t for t, _ in first.top] == best.indices.tolist()
    assert all(abs(v - w) < 1e-6 for (_, v), w in zip(first.top, best.values.tolist(), strict=True))


def test_a_thinking_budget_closes_the_reasoning_and_the_grammar_starts_after_it(llm):
    """The budget's forced `</think>` is committed by the scheduler, never sampled: the runner hands those
    tokens to the grammar, so the answer after the forced close is still valid JSON (a random-weight model
    never writes `</think>` by itself, so without the hand-off the answer would be unconstrained text)."""
    spec = replace(json_schema_spec(SCHEMA, strict=True), in_reasoning=True)
    params = SamplingParams(temperature=0.0, max_tokens=300, thinking_budget=3, structured=spec)
    with one_thread():
        out = llm.generate("<think>\n", params)[0]
    think_end = llm.tokenizer.encode("</think>")
    assert len(think_end) == 1 and think_end[0] in out.token_ids, out.token_ids
    answer_ids = out.token_ids[out.token_ids.index(think_end[0]) + 1 :]
    if answer_ids and answer_ids[-1] in llm.tokenizer.eos_token_ids:
        answer_ids = answer_ids[:-1]
    assert out.finish_reason == "stop", out.text
    jsonschema.validate(json.loads(llm.tokenizer.decode(answer_ids)), SCHEMA)


def test_overlapped_masks_give_the_same_generations_as_the_synchronous_path(llm):
    """The masks computed ahead in the worker thread (`GrammarRows.overlap`, the default) and the synchronous
    path sample the same tokens: a thinking budget's forced `</think>`, a forced tool call, a seeded JSON row
    and a free row in one batch (tests/engine/test_structured_overlap.py has the step-by-step check)."""
    json_spec = json_schema_spec(SCHEMA, strict=True)
    prompts = ["<think>\n", "Name and number", "Call the tool", "Free text"]
    params = [
        SamplingParams(temperature=0.0, max_tokens=40, thinking_budget=3, structured=replace(json_spec, in_reasoning=True)),
        SamplingParams(temperature=1.0, seed=3, max_tokens=40, structured=json_spec),
        SamplingParams(temperature=1.0, seed=4, max_tokens=40, structured=tool_call_spec([WEATHER], parallel=True, forced=True)),
        SamplingParams(temperature=1.0, seed=5, max_tokens=20),
    ]  # fmt: skip
    rows = llm.core.runner.sampler.grammars
    outs = {}
    for overlap in (False, True):
        rows.overlap = overlap
        before = rows.num_precomputed
        with one_thread():
            outs[overlap] = [o.token_ids for o in llm.generate(prompts, params)]
        rows.settle()
        assert (rows.num_precomputed > before) == overlap
    rows.overlap = True
    assert outs[True] == outs[False]
