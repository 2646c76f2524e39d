"""The thinking budget through the real engine on the tiny model, and the context limit at start."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
from engine_harness import make_core, one_thread, prompt, run, tiny_loaded

from engine.config import EngineConfig
from engine.core import THINK_CLOSE, EngineCore
from engine.request import SamplingParams


def test_the_engine_closes_a_reasoning_whose_budget_is_spent() -> None:
    core = make_core(prefix_reuse=False)
    tokenizer = core.tokenizer
    close = tokenizer.encode(THINK_CLOSE)
    opened = [*prompt(12, seed=3), tokenizer.special_ids.think_start_id]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    with one_thread():
        free = run(core, [opened], params)[0][0]
        budgeted = run(core, [opened], dataclasses.replace(params, thinking_budget=4))[0][0]
    assert budgeted[:4] == free[:4]  # the budget's reasoning tokens are the model's own
    assert budgeted[4 : 4 + len(close)] == close  # then the template's close, in place of the 5th
    assert len(budgeted) == 12  # and the answer goes on after it


def test_a_context_beyond_the_models_native_one_is_refused_at_start() -> None:
    loaded: Any = tiny_loaded("dense")
    short = SimpleNamespace(config=dataclasses.replace(loaded.model.config, max_position_embeddings=256))
    with pytest.raises(ValueError, match="max_context=512: must be <= 256, this model's native context"):
        EngineCore(short, loaded.tokenizer, EngineConfig.from_flags(max_context=512))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must be <= 262,144"):
        EngineConfig.from_flags(max_context=300_000)


def test_a_stop_string_inside_the_reasoning_does_not_end_the_request() -> None:
    core = make_core(prefix_reuse=False)
    tokenizer = core.tokenizer
    opened = [*prompt(12, seed=5), tokenizer.special_ids.think_start_id]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    with one_thread():
        free = run(core, [opened], params)[0][0]
        assert tokenizer.special_ids.think_end_id not in free  # the whole output is reasoning
        stop = tokenizer.decode(free[2:4])  # text the reasoning holds
        assert stop.strip()
        tokens, finish = run(core, [opened], dataclasses.replace(params, stop=(stop,)))
    assert tokens[0] == free and finish[next(iter(finish))].reason.kind.value == "length"
