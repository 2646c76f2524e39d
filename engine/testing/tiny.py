"""`build-tiny`: small random-weight models of the real Qwen3.5 family layout, deterministic for a seed.

(engine/testing: a tool beside the engine, never imported by its core.) The tiny models keep everything that makes the family what it is — Gated DeltaNet and gated full attention
in the 3:1 pattern, partial interleaved mRoPE, GQA, the MTP module, the real 248,320-row vocabulary with the
real Qwen3.5 tokenizer and our chat template — and shrink only the widths. They are the demo model and the
test models; their identities (`ninfer-tiny-dense/*`, `ninfer-tiny-moe/*`) are development entries of the
registry.

Weights come from our own seeded generator (not from any library's initialiser), so the same seed gives the
same bytes across library versions.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine.artifact.container import write_artifact
from engine.artifact.convert import frontend_resources

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

TINY_MODEL_IDS = {"dense": "ninfer-tiny-dense", "moe": "ninfer-tiny-moe"}
TINY_WEIGHTS_ID = "bf16-tiny"
VOCAB_SIZE = 248_320

_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "max_position_embeddings": 262_144,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "hidden_act": "silu",
    "mtp_num_hidden_layers": 1,
    # partial RoPE on 8 of 32 dims: interleaved mrope sections sum to rotary_dim / 2
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10_000_000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    },
    "bos_token_id": None,
    "eos_token_id": 248046,
    "pad_token_id": 248044,
}
_DENSE: dict[str, Any] = {"intermediate_size": 160}
_MOE: dict[str, Any] = {
    "moe_intermediate_size": 48,
    "shared_expert_intermediate_size": 48,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "router_aux_loss_coef": 0.001,
}


def tiny_hf_config(arch: str) -> dict[str, Any]:
    """The HF `config.json` of a tiny model (text config, as `Qwen3_5*ForCausalLM.save_pretrained` writes)."""
    from transformers import Qwen3_5MoeTextConfig, Qwen3_5TextConfig

    config_class: type[PreTrainedConfig]
    if arch == "dense":
        config_class = Qwen3_5TextConfig
    elif arch == "moe":
        config_class = Qwen3_5MoeTextConfig
    else:
        raise ValueError(f"arch must be 'dense' or 'moe', got {arch!r}")
    fields = {**_COMMON, **(_DENSE if arch == "dense" else _MOE)}
    mtp_layers = fields.pop("mtp_num_hidden_layers")
    config = config_class(**fields).to_dict()
    config["mtp_num_hidden_layers"] = mtp_layers  # what the real checkpoints carry; HF ignores it
    config["architectures"] = ["Qwen3_5ForCausalLM" if arch == "dense" else "Qwen3_5MoeForCausalLM"]
    config["torch_dtype"] = "bfloat16"
    return config


def _init_tensor(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Seeded values that give a well-behaved random model (finite activations, varied tokens)."""
    if name.endswith("A_log"):
        return torch.empty(shape).uniform_(1.0, 16.0, generator=gen).log()
    if name.endswith("dt_bias"):
        return torch.ones(shape)
    if name.endswith("linear_attn.norm.weight"):
        return torch.ones(shape)  # plain-weight gated RMSNorm
    if len(shape) == 1 and "norm" in name:
        return torch.zeros(shape)  # (1 + w) RMSNorm
    if name.endswith("conv1d.weight"):
        return torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
    if name.endswith("embed_tokens.weight"):
        return torch.randn(shape, generator=gen)
    fan_in = shape[-1]
    return torch.randn(shape, generator=gen) / math.sqrt(fan_in)


def tiny_weights(config: dict[str, Any], seed: int) -> list[tuple[str, torch.Tensor]]:
    from engine.model.config import ModelConfig
    from engine.model.weights import expected_weights

    model_config = ModelConfig.from_hf(config)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for name, shape in expected_weights(model_config, with_mtp=True).items():
        value = _init_tensor(name, tuple(shape), gen)
        out.append((name, value if name.endswith("A_log") else value.to(torch.bfloat16)))
    return out


# `vision=True`: a tiny vision tower too (the Qwen3.5 tower's layout, patch 16, merge 2, 2 blocks of 32), with
# the real media token ids and a small pixel budget (a 64x64 image is 4 placeholder tokens), for --vision tests.
TINY_VISION: dict[str, Any] = {
    "depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "in_channels": 3, "patch_size": 16,
    "temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 64, "num_position_embeddings": 16,
    "hidden_act": "gelu_pytorch_tanh",
}  # fmt: skip
TINY_PREPROCESSOR: dict[str, Any] = {
    "size": {"shortest_edge": 64 * 64, "longest_edge": 128 * 128}, "patch_size": 16, "temporal_patch_size": 2,
    "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
}  # fmt: skip
MEDIA_TOKEN_IDS = {"image_token_id": 248056, "video_token_id": 248057, "vision_start_token_id": 248053,
                   "vision_end_token_id": 248054}  # fmt: skip


def _vision_weights(gen: torch.Generator) -> list[tuple[str, torch.Tensor]]:
    from engine.model.vision import VisionConfig, VisionTower

    with torch.device("meta"):
        tower = VisionTower(VisionConfig.from_hf({"vision_config": TINY_VISION}))
    out = []
    for name, param in tower.state_dict().items():
        shape = tuple(param.shape)
        if len(shape) == 1:
            value = torch.ones(shape) if "norm" in name and name.endswith("weight") else torch.zeros(shape)
        else:
            value = torch.randn(shape, generator=gen) / math.sqrt(math.prod(shape[1:]))
        out.append((f"model.visual.{name}", value.to(torch.bfloat16)))
    return out


def build_tiny(
    out: str | os.PathLike[str],
    *,
    arch: str = "dense",
    seed: int = 0,
    dflash: bool = False,
    vision: bool = False,
) -> Path:
    """Write a tiny `.ninfer` model; the same arch and seed give the same file, byte for byte. `dflash` (MoE
    only) adds a tiny DFlash companion (engine/testing/tiny_dflash.py) for `--spec dflash`; `vision` a tiny
    vision tower (TINY_VISION) for `--vision`."""
    config = tiny_hf_config(arch)
    tensors = tiny_weights(config, seed)
    resources = frontend_resources(config, moe=arch == "moe")
    if vision:
        composite = {
            "architectures": ["Qwen3_5MoeForConditionalGeneration" if arch == "moe" else "Qwen3_5ForConditionalGeneration"],
            "model_type": "qwen3_5_moe" if arch == "moe" else "qwen3_5",
            "text_config": config, "vision_config": TINY_VISION, **MEDIA_TOKEN_IDS,
        }  # fmt: skip
        resources = [*frontend_resources(composite, moe=arch == "moe"),
                     ("preprocessor_config.json", json.dumps(TINY_PREPROCESSOR).encode())]  # fmt: skip
        tensors = [*tensors, *_vision_weights(torch.Generator().manual_seed(seed + 1))]
    if dflash:
        if arch != "moe":
            raise ValueError("--dflash: DFlash drafts for the MoE target only (use --arch moe)")
        from engine.testing.tiny_dflash import TINY_DFLASH, tiny_dflash_resource, tiny_dflash_tensors

        tensors = [*tensors, *tiny_dflash_tensors(TINY_DFLASH, seed)]
        resources = [*resources, tiny_dflash_resource(TINY_DFLASH)]
    return write_artifact(
        out,
        model_id=TINY_MODEL_IDS[arch],
        weights_id=TINY_WEIGHTS_ID,
        tensors=tensors,
        resources=resources,
    )
