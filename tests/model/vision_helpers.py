"""The tiny random vision-language checkpoint the multimodal parity tests share: HF transformers'
``Qwen3_5ForConditionalGeneration`` (or the MoE variant) saved with ``save_pretrained`` and loaded back as our text
model plus our vision tower, float32 on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import (
    Qwen3_5Config,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeConfig,
    Qwen3_5MoeForConditionalGeneration,
)

from engine.model import ModelConfig, build_model, collect_weights
from engine.model.vision import VisionConfig, build_vision_tower

IMAGE, VIDEO, START, END = 190, 191, 192, 193
TEXT_VOCAB = 180  # greedy picks among the ids below the media tokens (a placeholder is never generated)
TEXT = dict(
    vocab_size=200, hidden_size=48, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
    num_key_value_heads=1, head_dim=32, linear_num_key_heads=1, linear_num_value_heads=2,
    linear_key_head_dim=16, linear_value_head_dim=16,
    rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.75,
                     "mrope_section": [4, 4, 4], "mrope_interleaved": True},
)  # fmt: skip
MOE_TEXT = {
    **{k: v for k, v in TEXT.items() if k != "intermediate_size"},
    "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 24, "shared_expert_intermediate_size": 32,
}  # fmt: skip
ARCHS = {
    "dense": (Qwen3_5Config, Qwen3_5ForConditionalGeneration, TEXT),
    "moe": (Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration, MOE_TEXT),
}
VISION = dict(
    depth=2, hidden_size=40, intermediate_size=56, num_heads=2, patch_size=4, temporal_patch_size=2,
    spatial_merge_size=2, out_hidden_size=48, num_position_embeddings=36,
)  # fmt: skip


def build_tiny_vl(arch: str, path: Path) -> tuple:
    """(hf, ours, tower, text_config, raw config.json) of a tiny random checkpoint saved under ``path``."""
    config_cls, model_cls, text = ARCHS[arch]
    config = config_cls(
        text_config=text, vision_config=VISION, image_token_id=IMAGE, video_token_id=VIDEO,
        vision_start_token_id=START, vision_end_token_id=END,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = model_cls(config).float().eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=gen) * 2.5 - 1.0)
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif "norm" in name and "visual" in name:
                p.copy_(1 + torch.randn(p.shape, generator=gen) * 0.1)
            elif "norm" in name:
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5 if "linear_attn" in name else
                        torch.randn(p.shape, generator=gen) * 0.3)  # fmt: skip
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if "visual" in name else 0.08))
    hf.save_pretrained(path)
    raw = json.loads((path / "config.json").read_text())
    tensors = {}
    for file in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(file))
    text_config = ModelConfig.from_hf(raw)
    ours = build_model(text_config, collect_weights(tensors, tensors.__getitem__, text_config, False))
    tower = build_vision_tower(VisionConfig.from_hf(raw), list(tensors), tensors.__getitem__, torch.float32)
    return hf, ours, tower, text_config, raw


def prompt_ids(pieces: list[tuple[str, int]], seed: int) -> list[int]:
    """Random text ids below the media ids, and ``<start> placeholder * n <end>`` for each medium piece."""
    gen = torch.Generator().manual_seed(seed)
    ids: list[int] = []
    for kind, n in pieces:
        if kind == "text":
            ids += torch.randint(0, TEXT_VOCAB, (n,), generator=gen).tolist()
        else:
            ids += [START] + [IMAGE if kind == "image" else VIDEO] * n + [END]
    return ids
