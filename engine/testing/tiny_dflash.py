"""A tiny DFlash companion for the tiny MoE model (`build-tiny --arch moe --dflash`): the test stand-in for the
published Qwen3.6-35B-A3B companion (engine/spec/dflash.py), same layout, small widths.

It keeps what makes the companion what it is — sliding-window layers and a full one, all non-causal, GQA,
features from several target layers, the real mask row — with a window of 8 so that the CPU tests' prompts
run past it. Weights come from our own seeded generator (engine.testing.tiny's rule).
"""

from __future__ import annotations

import json
import math

import torch

from engine.spec.dflash import FULL, SLIDING, DFlashConfig, expected_shapes
from engine.spec.dflash_draft import CONFIG_RESOURCE, TENSOR_PREFIX

TINY_DFLASH = DFlashConfig(
    hidden_size=64,  # the tiny models' hidden size: the companion reads the target's embedding and head
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    layer_types=(SLIDING, SLIDING, FULL),
    sliding_window=8,
    block_size=16,
    mask_token_id=248077,
    target_layer_ids=(1, 3, 5, 6),  # of the tiny model's 8 layers
)


def tiny_dflash_tensors(config: DFlashConfig, seed: int) -> list[tuple[str, torch.Tensor]]:
    """`dflash.*` tensors (bf16) of a random companion: projections ~ N(0, 1/fan_in), norms 1."""
    gen = torch.Generator().manual_seed(seed + 1)
    out = []
    for name, shape in expected_shapes(config).items():
        if len(shape) == 1:
            value = torch.ones(shape)
        else:
            value = torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
        out.append((TENSOR_PREFIX + name, value.to(torch.bfloat16)))
    return out


def tiny_dflash_resource(config: DFlashConfig) -> tuple[str, bytes]:
    return CONFIG_RESOURCE, json.dumps(config.to_hf(), indent=2, sort_keys=True).encode("utf-8")
