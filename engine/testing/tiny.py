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


def build_tiny(
    out: str | os.PathLike[str], *, arch: str = "dense", seed: int = 0, dflash: bool = False
) -> Path:
    """Write a tiny `.ninfer` model; the same arch and seed give the same file, byte for byte. `dflash` (MoE
    only) adds a tiny DFlash companion (engine/testing/tiny_dflash.py) for `--spec dflash`."""
    config = tiny_hf_config(arch)
    tensors, resources = tiny_weights(config, seed), frontend_resources(config, moe=arch == "moe")
    if dflash:
        if arch != "moe":
            raise ValueError("--dflash: DFlash drafts for the MoE target only (use --arch moe)")
        from engine.testing.tiny_dflash import TINY_DFLASH, tiny_dflash_resource, tiny_dflash_tensors

        tensors += tiny_dflash_tensors(TINY_DFLASH, seed)
        resources.append(tiny_dflash_resource(TINY_DFLASH))
    return write_artifact(
        out, model_id=TINY_MODEL_IDS[arch], weights_id=TINY_WEIGHTS_ID, tensors=tensors, resources=resources
    )
