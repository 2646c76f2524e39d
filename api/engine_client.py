"""What the HTTP layer needs from the engine, and how `ninfer-serve` obtains one.

`EngineClient` is the structural interface of `engine.serving.AsyncEngine`; tests may serve any object
with the same shape (a scripted engine that replays fixed continuations through the real tokenizer). Burst
admission's `announce(request_id)` / `withdraw(request_id)` are optional: the request gate (api/app.py) calls
them where the engine has them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from engine.config import EngineConfig
from engine.request import Event, SamplingParams
from engine.tokenizer import Tokenizer


class EngineClient(Protocol):
    tokenizer: Tokenizer
    model_id: str
    config: EngineConfig

    def start(self) -> None: ...

    def shutdown(self, drain: bool = True) -> None: ...

    def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        checkpoint_positions: Sequence[int] = (),
        *,
        thinking: bool = True,
    ) -> AsyncIterator[Event]: ...

    def abort(self, request_id: str) -> None: ...

    def stats(self) -> Any: ...


def tokenizer_from_artifact(path: str | Path) -> tuple[str, Tokenizer, dict[str, Any]]:
    """(identity model id, tokenizer, HF config) of an artifact, without loading any weight."""
    from engine.artifact.container import read_artifact

    with read_artifact(path) as artifact:
        tokenizer = Tokenizer(
            artifact.resource("tokenizer.json"),
            artifact.resource("tokenizer_config.json"),
            artifact.resource("chat_template.jinja").decode("utf-8"),
            artifact.resource("generation_config.json"),
        )
        return artifact.model_id, tokenizer, artifact.hf_config()


def load_engine(path: str, config: EngineConfig, server_sampling: SamplingParams) -> EngineClient:
    """The real engine for `path`; it resolves sampling (model preset, then these flags, then the request)."""
    from engine.serving import AsyncEngine

    engine: EngineClient = AsyncEngine.from_artifact(path, config, server_sampling=server_sampling)
    return engine


def load_synthetic_engine(
    name: str, config: EngineConfig, server_sampling: SamplingParams, weights_id: str | None = None
) -> EngineClient:
    """The real engine over random weights of geometry `name` (engine/testing/synthetic.py), built on the
    device, with the real Qwen3.5 tokenizer and chat template; model id `<name>-synthetic`. `weights_id`: a
    weight profile (`--weights-id`): random payloads in its formats (engine/testing/synthetic_quant.py)."""
    from engine.serving import AsyncEngine
    from engine.testing.synthetic import SYNTHETIC_WEIGHTS_ID, load_synthetic

    model, tokenizer, model_id = load_synthetic(
        name, weights_id=weights_id, with_mtp=config.spec == "mtp", with_dflash=config.spec == "dflash"
    )
    engine: EngineClient = AsyncEngine(
        model,
        tokenizer,
        config,
        model_id=model_id,
        server_sampling=server_sampling,
        synthetic=name,
        weights_id=SYNTHETIC_WEIGHTS_ID if weights_id is None else f"{SYNTHETIC_WEIGHTS_ID}:{weights_id}",
    )
    return engine
