"""NInfer's inference engine: artifact, model, cache, scheduler, runner, sampling and serving.

`from engine import LLM, SamplingParams` is the offline Python API (engine/llm.py). Both names are
imported lazily, so `import engine.request` does not load the model stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.llm import LLM
    from engine.request import SamplingParams

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from engine.request import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
