"""DESIGN invariants 1 and 2 through the real runner on the tiny dense and MoE artifacts (float32, CPU):
batched = alone, prefix-reused = cold, chunked prefill = unchunked; and greedy tokens = HF transformers'
full-forward argmax (HF `generate` is not the oracle: its logits differ from its own forward)."""

from __future__ import annotations

import pytest
import torch
from engine_harness import GREEDY, alone, make_core, one_thread, prompt, run, tiny_artifact, tiny_loaded

from engine.artifact.container import read_artifact
from engine.request import SamplingParams, TokenEvent
from engine.testing.tiny import tiny_hf_config

ARCHS = ["dense", "moe"]
LENGTHS = [5, 17, 40, 66, 9, 100, 3, 30]


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def alone_tokens():
    cache: dict[str, list[list[int]]] = {}

    def get(arch: str) -> list[list[int]]:
        if arch not in cache:
            with one_thread():
                cache[arch] = alone(arch, [prompt(n, seed) for seed, n in enumerate(LENGTHS)])
        return cache[arch]

    return get


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("batch_size", [2, 5, 8])
def test_batched_requests_equal_each_alone(arch, batch_size, alone_tokens):
    """Half the batch arrives three steps late, so prefill chunks share steps with decode rows."""
    expected = alone_tokens(arch)[:batch_size]
    prompts = [prompt(n, seed) for seed, n in enumerate(LENGTHS)][:batch_size]
    core = make_core(arch, max_concurrency=8, prefill_chunk=32)
    tokens: dict[str, list[int]] = {}
    early = batch_size // 2
    for k in range(early):
        assert core.add_request(f"b{k}", prompts[k], GREEDY) is None
    num_steps = 0
    while core.has_work() or num_steps < 3:
        if num_steps == 3:
            for k in range(early, batch_size):
                assert core.add_request(f"b{k}", prompts[k], GREEDY) is None
        for event in core.step():
            if isinstance(event, TokenEvent):
                tokens.setdefault(event.request_id, []).extend(event.token_ids)
        core.check_integrity()
        num_steps += 1
    assert [tokens[f"b{k}"] for k in range(batch_size)] == expected


@pytest.mark.parametrize("arch", ARCHS)
def test_chunked_prefill_equals_unchunked(arch):
    long_prompt = prompt(90, 11)
    reference = None
    for chunk in [1024, 64, 7, 1]:  # 1024 covers the prompt in one step: the unchunked reference
        core = make_core(arch, prefill_chunk=chunk, prefix_reuse=False)
        tokens, finish = run(core, [long_prompt], SamplingParams(temperature=0.0, max_tokens=4))
        assert core.stats().num_steps >= -(-90 // chunk) + 3, f"chunk {chunk}: prefill was not chunked"
        if reference is None:
            reference = tokens[0]
        assert tokens[0] == reference, f"chunk size {chunk}"


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_under_the_decoding_budget_equals_alone(arch):
    """A 90-token prompt arrives while another lane decodes: it prefills in 8-token chunks (the decoding
    budget, not the 64-token prefill_chunk) beside that lane's decode rows; both give their alone tokens."""
    params = SamplingParams(temperature=0.0, max_tokens=20)
    prompts = {"dec": prompt(12, 51), "pre": prompt(90, 52)}
    core = make_core(arch, max_concurrency=2, prefill_chunk=64, prefill_chunk_decoding=8, prefix_reuse=False)
    schedule = core.scheduler.schedule
    steps: list[list[tuple[str, int]]] = []

    def recording_schedule():
        out = schedule()
        steps.append([(row.request_id, row.num_tokens) for row in out.rows])
        return out

    core.scheduler.schedule = recording_schedule  # type: ignore[method-assign]
    tokens: dict[str, list[int]] = {"dec": [], "pre": []}
    assert core.add_request("dec", prompts["dec"], params) is None
    while core.has_work():
        if len(tokens["dec"]) == 2 and core.scheduler.num_running == 1:
            assert core.add_request("pre", prompts["pre"], params) is None
        for event in core.step():
            if isinstance(event, TokenEvent):
                tokens[event.request_id].extend(event.token_ids)
        core.check_integrity()
    prefill_steps = [step for step in steps if any(rid == "pre" and n > 1 for rid, n in step)]
    assert [step[0] for step in prefill_steps] == [("dec", 1)] * 12  # each beside a decode row of "dec"
    assert [step[1] for step in prefill_steps] == [("pre", 8)] * 11 + [("pre", 2)]  # 90 prompt tokens
    stats = core.stats()  # /stats shows both budgets
    assert (stats.prefill_chunk, stats.prefill_chunk_decoding) == (64, 8)
    assert tokens["dec"] == alone(arch, [prompts["dec"]], params)[0]
    assert tokens["pre"] == alone(arch, [prompts["pre"]], params)[0]


@pytest.mark.parametrize("arch", ARCHS)
def test_prefix_reused_requests_equal_cold(arch):
    """Append a turn to a finished conversation, and rewind to an earlier message boundary."""
    core = make_core(arch, page_size=16)  # 16-token pages: reuse ends inside a page (copy-on-write)
    turn1 = prompt(50, 21)
    (out1,), _ = run(core, [turn1], checkpoints=[(20, 50)])
    cases = {
        "append": (turn1 + out1 + prompt(10, 22), len(turn1) + len(out1) - 1),  # the retained sequence
        "rewind": (turn1[:20] + prompt(15, 23), 20),  # a message-boundary checkpoint
        "branch": (turn1 + prompt(8, 24), 50),  # another answer to the first turn
    }
    for name, (ids, reused) in cases.items():
        (tokens,), finish = run(core, [ids])
        (event,) = finish.values()
        assert event.num_cached_tokens == reused, f"{name}: reused {event.num_cached_tokens}, want {reused}"
        assert tokens == alone(arch, [ids], page_size=16)[0], name
    stats = core.stats()
    assert stats.num_prefix_hits == 3
    assert stats.num_prefix_hit_tokens == sum(reused for _, reused in cases.values())


def _hf_model(arch: str) -> torch.nn.Module:
    from transformers import (
        Qwen3_5ForCausalLM,
        Qwen3_5MoeForCausalLM,
        Qwen3_5MoeTextConfig,
        Qwen3_5TextConfig,
    )

    config = tiny_hf_config(arch)
    config_cls, model_cls = (
        (Qwen3_5TextConfig, Qwen3_5ForCausalLM)
        if arch == "dense"
        else (Qwen3_5MoeTextConfig, Qwen3_5MoeForCausalLM)
    )
    model = model_cls(config_cls.from_dict(config)).eval()
    artifact = read_artifact(tiny_artifact(arch))
    state = {name: artifact.tensor(name).float() for name in model.state_dict()}
    model.load_state_dict(state, strict=True)
    return model


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tokens_equal_hf_full_forward_argmax(arch):
    ids = prompt(30, 31)
    core = make_core(arch, prefill_chunk=16)
    (tokens,), _ = run(core, [ids], SamplingParams(temperature=0.0, max_tokens=12))
    assert len(tokens) == 12
    with torch.inference_mode():
        logits = _hf_model(arch)(torch.tensor([ids + tokens])).logits[0]
    hf_argmax = logits[len(ids) - 1 : -1].argmax(dim=-1).tolist()
    assert tokens == hf_argmax
    assert tiny_loaded(arch).model.config.vocab_size == logits.shape[-1]


def test_abort_at_any_step_frees_lane_and_pages_and_the_others_continue():
    """Abort the middle request before admission, mid chunked prefill, at a checkpoint save, or while
    decoding: the page accounting holds after every step and the other two get their alone tokens."""
    prompts = [prompt(20, 41), prompt(45, 42), prompt(12, 43)]
    expected = alone("dense", [prompts[0], prompts[2]], page_size=16)
    for abort_at in range(12):
        core = make_core("dense", max_concurrency=2, page_size=16, prefill_chunk=16)
        tokens: dict[str, list[int]] = {"a": [], "b": [], "c": []}
        for name, ids, marks in zip("abc", prompts, [(), (16, 30), ()], strict=True):
            assert core.add_request(name, ids, GREEDY, marks) is None
        step = 0
        while core.has_work():
            if step == abort_at:
                event = core.abort("b", "test")
                assert event is None or event.reason.kind.value == "aborted"
            for event in core.step():
                if isinstance(event, TokenEvent):
                    tokens[event.request_id].extend(event.token_ids)
            core.check_integrity()
            step += 1
        assert [tokens["a"], tokens["c"]] == expected, f"abort at step {abort_at}"
        assert core.stats().num_requests_finished.get("aborted", 0) == (1 if len(tokens["b"]) < 6 else 0)
        assert core.scheduler.num_running == 0 and not core.runner._output_token_ids
