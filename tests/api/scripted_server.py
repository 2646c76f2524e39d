"""`python tests/api/scripted_server.py [ninfer-serve flags] [--keepalive-seconds S] [--scripts FILE]`: the
real app and flag parsing of `ninfer-serve`, serving `ScriptedEngine` instead of the model (tests only).
`--scripts FILE` adds scenarios: a JSON object `{"name": ["reasoning", "content"], ...}`."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scripted import SCRIPTS, ScriptedEngine  # noqa: E402

import api.serve as serve  # noqa: E402
from api.engine_client import tokenizer_from_artifact  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.request import SamplingParams  # noqa: E402


def _factory(artifact: str, config: EngineConfig, sampling: SamplingParams) -> ScriptedEngine:
    model_id, tokenizer, _ = tokenizer_from_artifact(artifact)
    return ScriptedEngine(tokenizer, model_id, config)


def main() -> None:
    argv = sys.argv[1:]
    keepalive = None
    if "--keepalive-seconds" in argv:
        at = argv.index("--keepalive-seconds")
        keepalive = float(argv[at + 1])
        del argv[at : at + 2]
    if "--scripts" in argv:
        at = argv.index("--scripts")
        extra = json.loads(Path(argv[at + 1]).read_text(encoding="utf-8"))
        SCRIPTS.update({name: (reasoning, content, 0.0) for name, (reasoning, content) in extra.items()})
        del argv[at : at + 2]
    if keepalive is not None:
        original = serve.parse_args

        def parse_args(args: list[str] | None = None):  # type: ignore[no-untyped-def]
            parsed, config, options = original(args)
            return parsed, config, dataclasses.replace(options, keepalive_seconds=keepalive)

        serve.parse_args = parse_args  # type: ignore[assignment]
    serve.main(argv, engine_factory=_factory)


if __name__ == "__main__":
    main()
