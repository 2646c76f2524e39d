"""Request, SamplingParams validation and merging, FinishReason."""

from __future__ import annotations

import pytest

from engine.request import FinishKind, FinishReason, RejectCode, Request, RequestStatus, SamplingParams


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 0),
        ("temperature", -0.1),
        ("temperature", 2.5),
        ("temperature", float("nan")),
        ("top_p", 0.0),
        ("top_p", 1.1),
        ("top_k", -2),
        ("top_k", 1.5),
        ("min_p", 1.5),
        ("presence_penalty", 2.1),
        ("frequency_penalty", -3.0),
        ("seed", "7"),
        ("stop_token_ids", (-1,)),
        ("stop", ("",)),
        ("ignore_eos", 1),
    ],
)
def test_sampling_params_refuse_bad_values_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"^{field}="):
        SamplingParams(**{field: value})  # type: ignore[arg-type]


def test_sampling_params_accept_vllm_spellings() -> None:
    params = SamplingParams(temperature=0, top_k=-1, stop="###", stop_token_ids=[7, 8])  # type: ignore[arg-type]
    assert params.greedy and params.stop == ("###",) and params.stop_token_ids == (7, 8)
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")  # type: ignore[arg-type]
    assert not SamplingParams().greedy


def test_merged_over_prefers_fields_set_here() -> None:
    base = SamplingParams(temperature=0.7, top_p=0.8, stop=("x",), seed=1)
    mine = SamplingParams(temperature=0.2, max_tokens=5)
    merged = mine.merged_over(base)
    assert (merged.temperature, merged.top_p, merged.max_tokens, merged.stop, merged.seed) == (
        0.2,
        0.8,
        5,
        ("x",),
        1,
    )


def test_request_tracks_prompt_and_output_tokens() -> None:
    req = Request("r", [1, 2, 3], checkpoint_positions=(3, 1, 3))
    assert req.status is RequestStatus.WAITING and req.checkpoint_positions == (1, 3)
    req.token_ids.append(9)
    assert (req.num_tokens, req.num_prompt_tokens, req.num_output_tokens, req.output_token_ids) == (
        4,
        3,
        1,
        [9],
    )
    assert req.prompt_token_ids == [1, 2, 3] and not req.is_finished


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"prompt_token_ids": []}, "prompt_token_ids"),
        ({"prompt_token_ids": [1, -2]}, "prompt_token_ids"),
        ({"prompt_token_ids": [1, 2], "checkpoint_positions": (3,)}, "checkpoint_positions"),
        ({"prompt_token_ids": [1, 2], "checkpoint_positions": (0,)}, "checkpoint_positions"),
    ],
)
def test_request_refuses_bad_input(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}="):
        Request("r", **kwargs)


def test_finish_reasons_render_and_carry_details() -> None:
    assert str(FinishReason.stop(5)) == "stop" and FinishReason.stop(5).stop_match == 5
    assert (
        FinishReason.length().kind is FinishKind.LENGTH and FinishReason.context().kind is FinishKind.CONTEXT
    )
    assert FinishReason.aborted("gone").message == "gone"
    rejected = FinishReason.rejected(RejectCode.OVERLOADED, "queue full")
    assert str(rejected) == "rejected(server_overloaded: queue full)"
    assert FinishKind.STOP == "stop" and RejectCode.QUEUE_TIMEOUT == "request_queue_timeout"
