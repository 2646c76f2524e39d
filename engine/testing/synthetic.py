"""Synthetic models: random weights of a real Qwen3.5-family geometry, drawn directly on the device.

Used by `ninfer-bench --synthetic` (engine/testing/bench/) and `ninfer-serve --synthetic` (api/serve.py): the
speed of a step does not depend on the weight values, so the real geometries can be measured and load-tested
without the checkpoints. The weights are noise; whatever serves them must say so (model id
``<geometry>-synthetic``, ``synthetic`` in /v1/models, /stats and the request log).

Geometries: ``qwen3.6-27b`` and ``qwen3.6-35b-a3b`` (the real sizes; a GPU is needed) and ``tiny-dense``
(the `build-tiny` dense layout, small enough for the CPU, so the serving path is tested in CI).
"""

from __future__ import annotations

import torch

from engine.artifact.profiles import REAL_CONFIGS
from engine.model.config import ModelConfig
from engine.model.qwen3_5 import Qwen3_5ForCausalLM
from engine.spec.dflash import PUBLISHED_35B_A3B, check_target, random_dflash
from engine.spec.dflash_draft import attach_dflash
from engine.testing.geometry import (
    REAL_GEOMETRIES,
    SYNTHETIC_NAMES,
    SYNTHETIC_WEIGHTS_ID,
    TINY_GEOMETRY,
    needs_cuda,
    synthetic_model_id,
)
from engine.tokenizer import Tokenizer

__all__ = [
    "GEOMETRIES",
    "SYNTHETIC_NAMES",
    "SYNTHETIC_WEIGHTS_ID",
    "TINY_GEOMETRY",
    "build_synthetic",
    "load_synthetic",
    "needs_cuda",
    "synthetic_config",
    "synthetic_model_id",
]


# The real geometries (random weights of these sizes need a GPU: 27B is ~54 GB in bf16): the published
# profiles' own table, so the synthetic models and the artifacts' inventories share one definition.
GEOMETRIES: dict[str, ModelConfig] = {name: REAL_CONFIGS[name] for name in REAL_GEOMETRIES}

assert tuple(GEOMETRIES) == REAL_GEOMETRIES, "geometry.py names the geometries built here"


def synthetic_config(name: str) -> ModelConfig:
    """The geometry called `name` (one of SYNTHETIC_NAMES); ValueError for any other name."""
    if name in GEOMETRIES:
        return GEOMETRIES[name]
    if name == TINY_GEOMETRY:
        from engine.testing.tiny import tiny_hf_config

        return ModelConfig.from_hf(tiny_hf_config("dense"))
    raise ValueError(f"synthetic geometry {name!r}: expected one of {', '.join(SYNTHETIC_NAMES)}")


def build_synthetic(
    config: ModelConfig,
    seed: int = 0,
    *,
    device: torch.device | str = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    with_mtp: bool = False,
) -> Qwen3_5ForCausalLM:
    """The geometry with random weights, allocated and drawn on `device` (no host copy on a GPU), its
    projections then fused (``Qwen3_5ForCausalLM.fuse_projections``: the same weights, one GEMM each)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = Qwen3_5ForCausalLM(config, with_mtp=with_mtp)
    finally:
        torch.set_default_dtype(previous)
    dev = torch.device(device)
    model = model.to_empty(device=dev)
    gen = torch.Generator(device=dev).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.02, generator=gen)
            elif name.endswith("A_log"):
                param.uniform_(0.0, 2.7, generator=gen)  # decay rates exp(A_log) in 1 .. 15
            elif name.endswith("dt_bias") or name.endswith("norm.weight") and "linear_attn" in name:
                param.fill_(1.0)
            else:
                param.zero_()  # (1 + w) RMSNorm weights
    model.requires_grad_(False)
    model.fuse_projections()  # as the artifact loader does: the same GEMMs as a real model runs
    model.eval()
    return model


def load_synthetic(
    name: str,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    seed: int = 0,
    with_mtp: bool = False,
    weights_id: str | None = None,
    with_dflash: bool = False,
) -> tuple[Qwen3_5ForCausalLM, Tokenizer, str]:
    """(model, the real Qwen3.5 tokenizer and chat template, model id) for geometry `name`; with `weights_id`
    (a weight profile key or kind) the weights are random payloads in that profile's formats
    (engine/testing/synthetic_quant.py), else dense.

    Defaults: the GPU when there is one, bf16 there and float32 on the CPU (engine.core's defaults).
    `with_dflash` attaches a random DFlash companion of the published 35B-A3B geometry (engine/spec/dflash.py):
    only the MoE geometry hosts one (ValueError for the others, before anything is built).

    ValueError when the geometry needs a GPU and there is none, or `weights_id` names no profile.
    """
    from engine.core import default_device, default_dtype

    config = synthetic_config(name)
    dev = torch.device(device) if device is not None else default_device()
    if needs_cuda(name) and dev.type != "cuda":
        raise ValueError(
            f"synthetic geometry {name!r} needs a CUDA device (use {TINY_GEOMETRY!r} on the CPU)"
        )
    dtype = dtype if dtype is not None else default_dtype(dev)
    if with_dflash:
        check_target(
            PUBLISHED_35B_A3B, config.hidden_size, config.num_hidden_layers, config.is_moe, config.vocab_size
        )
    if weights_id is not None:
        if with_mtp:
            raise ValueError(
                f"weights_id={weights_id!r}: quantized synthetic weights carry no MTP head (--spec mtp)"
            )
        from engine.testing.synthetic_quant import build_synthetic_quantized

        model = build_synthetic_quantized(config, weights_id, seed, device=dev, dtype=dtype)
    else:
        model = build_synthetic(config, seed, device=dev, dtype=dtype, with_mtp=with_mtp)
    if with_dflash:
        attach_dflash(model, random_dflash(PUBLISHED_35B_A3B, seed, device=dev, dtype=dtype))
    tokenizer = Tokenizer.qwen35(moe=config.is_moe)
    return model, tokenizer, synthetic_model_id(name)
