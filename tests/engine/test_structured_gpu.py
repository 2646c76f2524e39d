"""Structured outputs on the GPU: the grammar mask applied after CUDA-graph decode replays, batched across lanes,
gives schema-valid JSON on the tiny random-weight model, and free rows beside it decode as they do alone.

Run on the device machine (`-m gpu`); the CPU suite deselects it.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from engine_harness import prompt, run, tiny_artifact

from engine.config import EngineConfig
from engine.core import EngineCore, load_artifact
from engine.request import FinishEvent, SamplingParams, TokenEvent
from engine.structured import json_schema_spec

pytestmark = pytest.mark.gpu

SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
    },
    "required": ["color", "count", "ok"],
    "additionalProperties": False,
}


def test_json_schema_rows_with_graph_decode_are_valid_and_free_rows_unchanged() -> None:
    assert torch.cuda.is_available(), "the gpu marker needs a CUDA device"
    art = load_artifact(
        tiny_artifact("dense"), device="cuda", dtype=torch.float32
    )  # fp32: batched = alone exactly
    flags = dict(max_context=512, max_concurrency=8, pending_timeout_ms=600_000, prefill_chunk_multiple=1)
    core = EngineCore(art.model, art.tokenizer, EngineConfig.from_flags(**flags))
    assert core.runner.graphs_captured
    spec = json_schema_spec(SCHEMA, strict=True)
    constrained = SamplingParams(
        temperature=1.0, top_p=0.95, top_k=20, seed=3, max_tokens=300, structured=spec
    )
    free = SamplingParams(temperature=0.0, max_tokens=12)
    items = [prompt(20 + i, i) for i in range(8)]
    free_alone, _ = run(core, items[6:], free)
    before = core.runner.num_graph_steps
    ids = [f"mixed-{i}" for i in range(8)]
    for i, request_id in enumerate(ids):  # six constrained rows and two free ones in the same batches
        assert core.add_request(request_id, items[i], constrained if i < 6 else free) is None
    tokens: dict[str, list[int]] = {i: [] for i in ids}
    finish: dict[str, FinishEvent] = {}
    while core.has_work():
        for event in core.step():
            if isinstance(event, TokenEvent):
                tokens[event.request_id].extend(event.token_ids)
            else:
                finish[event.request_id] = event
    assert core.runner.num_graph_steps > before  # the mask rode on graph replays
    for request_id in ids[:6]:
        text = art.tokenizer.decode(tokens[request_id], skip_special_tokens=True)
        jsonschema.validate(json.loads(text), SCHEMA)
        assert finish[request_id].reason.kind.value == "stop"
    assert [tokens[i] for i in ids[6:]] == free_alone
