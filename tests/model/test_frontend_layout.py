"""An artifact in the published layout: resources under ``frontend/`` (tokenizer, chat template, generation and
model config), no top-level ``config.json``, quantized weights named by its identity's profile. Such a file
loads (engine/core.py, engine/tokenizer.py, engine/model/loader.py) and serves a chat through ``LLM``."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import LLM
from engine.artifact.cli import main as artifact_cli
from engine.artifact.container import Artifact, EncodedTensor, read_artifact, write_artifact
from engine.core import load_artifact
from engine.model.quant import QuantMethod
from engine.request import SamplingParams


def _frontend_layout(src: Path, dst: Path, keep: set[str] | None = None) -> Path:
    """``src`` rewritten with every resource under ``frontend/`` (``keep``: only those names)."""
    with Artifact(src) as art:
        tensors = [
            (
                e.name,
                EncodedTensor(e.shape, e.format, e.layout, bytes(art.raw_bytes(e.name)))
                if e.layout != "contiguous-le-v1"
                else art.tensor(e.name).clone(),
            )
            for e in art.directory.tensors
        ]
        resources = [
            ("frontend/" + n, art.resource(n)) for n in art.resource_names() if keep is None or n in keep
        ]
        model_id, weights_id = art.model_id, art.weights_id
    return write_artifact(dst, model_id=model_id, weights_id=weights_id, tensors=tensors, resources=resources)


@pytest.fixture(scope="module")
def converted(tiny, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("frontend") / "gw.ninfer"
    argv = ["convert", str(tiny("dense_a").path), str(out), "--model-id", "ninfer-tiny-dense"]
    assert artifact_cli([*argv, "--weights-id", "groupwise-int"]) == 0
    return out


def test_a_published_layout_artifact_loads_and_serves_a_chat(converted, tmp_path):
    path = _frontend_layout(converted, tmp_path / "published.ninfer")
    with Artifact(path) as art:
        assert "config.json" not in art.resource_names()
        assert {"frontend/tokenizer.json", "frontend/chat_template.jinja"} <= set(art.resource_names())
    loaded = load_artifact(path, device="cpu")
    assert loaded.tokenizer.chat_template is not None
    assert any(
        isinstance(m, QuantMethod) for m in (getattr(x, "method", None) for x in loaded.model.modules())
    )
    original = load_artifact(converted, device="cpu")
    assert loaded.tokenizer.eos_token_ids == original.tokenizer.eos_token_ids
    assert loaded.model.config == original.model.config
    llm = LLM(path, device="cpu", max_context=256, prefill_chunk_multiple=1, prefill_chunk=256)
    (out,) = llm.generate({"prompt_token_ids": [5, 17, 99, 3]}, SamplingParams(temperature=0.0, max_tokens=4))
    assert (
        len(out.outputs[0].token_ids) == 4
    )  # (the tiny vocabulary is 1,000 ids: a chat prompt would not fit)
    prompt = loaded.tokenizer.apply_chat_template([{"role": "user", "content": "Hello"}])
    assert prompt == original.tokenizer.apply_chat_template([{"role": "user", "content": "Hello"}])


def test_a_frontend_without_a_tokenizer_is_refused_by_name(converted, tmp_path):
    path = _frontend_layout(converted, tmp_path / "bare.ninfer", keep={"config.json"})
    with pytest.raises(ValueError, match="bare.ninfer: the artifact carries no tokenizer.json"):
        load_artifact(path, device="cpu")
    assert read_artifact(path).resource_names() == ["frontend/config.json"]
