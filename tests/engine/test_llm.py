"""`LLM(artifact, **config).generate(...)`: vLLM-shaped outputs, stop strings, seeded sampling that
repeats exactly (alone or batched), and more prompts than lanes."""

from __future__ import annotations

import pytest
from engine_harness import one_thread, tiny_artifact

from engine import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm():
    with one_thread():
        yield LLM(tiny_artifact("dense"), max_context=512, max_concurrency=3, device="cpu")


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


def test_outputs_carry_token_ids_text_and_finish_reason_in_prompt_order(llm):
    tok = llm.get_tokenizer()
    prompts = ["Hello there", tok.encode("The capital of France is"), {"prompt": "Once upon a time"}]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=5))
    assert [o.prompt for o in outs] == ["Hello there", None, "Once upon a time"]
    assert outs[1].prompt_token_ids == tok.encode("The capital of France is")
    for out in outs:
        assert len(out.token_ids) == 5 and out.finish_reason == "length"
        assert out.text == tok.decode(out.token_ids, skip_special_tokens=True)
        assert out.outputs[0].text == out.text
    alone = [llm.generate(p, SamplingParams(temperature=0, max_tokens=5))[0].token_ids for p in prompts]
    assert alone == [o.token_ids for o in outs]


def test_stop_string_ends_the_request_and_is_cut_from_the_text(llm):
    greedy = SamplingParams(temperature=0, max_tokens=12)
    full = llm.generate("Tell me a story", greedy)[0]
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 3]
    cut = llm.generate("Tell me a story", SamplingParams(temperature=0, max_tokens=12, stop=[stop]))[0]
    assert cut.finish_reason == "stop" and cut.outputs[0].stop_reason == stop
    assert cut.text == full.text[: full.text.index(stop)]
    assert len(cut.token_ids) < len(full.token_ids)
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)]


def test_a_stop_string_in_the_reasoning_of_a_chat_neither_ends_nor_cuts_it(llm):
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    ask = [{"role": "user", "content": "Tell me a story"}]
    full = llm.chat(ask, greedy)  # thinking on: the random model never closes </think>, all is reasoning
    stop = full.text.strip()[2:5]
    stopped = llm.chat(ask, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, stop=[stop]))
    assert stopped.text == full.text and stopped.finish_reason == "length"


def test_seeded_sampling_repeats_exactly_alone_and_in_a_batch(llm):
    seeded = SamplingParams(temperature=1.0, top_p=0.95, top_k=50, seed=1234, max_tokens=10)
    first = llm.generate("Pick a number", seeded)[0].token_ids
    again = llm.generate("Pick a number", seeded)[0].token_ids
    unseeded = SamplingParams(temperature=1.0, max_tokens=10)
    batched = llm.generate(["Pick a number", "Other", "Third"], [seeded, unseeded, unseeded])[0].token_ids
    other_seed = llm.generate("Pick a number", SamplingParams(temperature=1.0, seed=99, max_tokens=10))[0]
    assert first == again == batched
    assert other_seed.token_ids != first


def test_more_prompts_than_lanes_and_pending_places_all_complete(llm):
    outs = llm.generate(
        [[1000 + k, 2000 + k] for k in range(25)], SamplingParams(temperature=0, max_tokens=2)
    )
    assert len(outs) == 25 and all(len(o.token_ids) == 2 for o in outs)
    llm.core.check_integrity()


def test_impossible_prompt_raises_with_the_numbers(llm):
    with pytest.raises(ValueError, match="prompt 0: prompt has 600 tokens; max_context is 512"):
        llm.generate([[1000] * 600], SamplingParams(max_tokens=2))
    assert llm.core.scheduler.num_running == 0
