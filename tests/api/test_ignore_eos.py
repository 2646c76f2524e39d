"""Chat Completions' `ignore_eos` extension (vLLM's name): the request field reaches the engine's
`SamplingParams.ignore_eos` (the scheduler's test proves that EOS then no longer ends a request), it defaults
off, and a value that is not a boolean is a 400 naming the field."""

from __future__ import annotations

import pytest

from api.body import validate
from api.errors import ApiError
from api.openai.convert import chat_plan
from api.openai.schemas import ChatCompletionRequest
from api.options import ServerOptions

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("given", [True, False, None])
def test_ignore_eos_reaches_the_sampling_params(given: bool | None) -> None:
    body = {"messages": MESSAGES, "max_tokens": 4} | ({} if given is None else {"ignore_eos": given})
    plan = chat_plan(validate(ChatCompletionRequest, body), ServerOptions())
    assert plan.params.ignore_eos is bool(given)
    assert plan.params.max_tokens == 4


def test_ignore_eos_that_is_not_a_boolean_is_refused() -> None:
    with pytest.raises(ApiError) as info:
        validate(ChatCompletionRequest, {"messages": MESSAGES, "ignore_eos": {"yes": 1}})
    assert info.value.status == 400 and "ignore_eos" in str(info.value.param)
