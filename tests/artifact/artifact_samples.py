"""Sample objects for the artifact tests (a uniquely named module: test files import it by name)."""

from __future__ import annotations

from typing import Any

import torch

from engine.artifact.container import EncodedTensor


def sample_objects() -> tuple[list[tuple[str, Any]], list[tuple[str, bytes]]]:
    gen = torch.Generator().manual_seed(7)
    tensors: list[tuple[str, Any]] = [
        ("w.bf16", torch.randn(3, 5, generator=gen).to(torch.bfloat16)),
        ("w.fp32", torch.randn(7, generator=gen)),
        ("w.i32", torch.arange(-4, 5, dtype=torch.int32).reshape(3, 3)),
        ("w.scalar", torch.tensor(2.5)),
        ("w.f16", torch.randn(2, 3, 4, generator=gen).to(torch.float16)),
        (
            "w.q5",
            EncodedTensor((2, 130), "Q5G64_F16S", "row-split-k128-v1", bytes(range(256)) * 2 + bytes(16)),
        ),
    ]
    resources = [
        ("config.json", b'{"model_type": "qwen3_5_text"}'),
        ("notes.txt", "h\u00e9llo \u2603".encode()),
    ]
    return tensors, resources
