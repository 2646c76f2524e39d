"""Tiny random Qwen3.5 checkpoints written by HF transformers, and a small paged-batch driver.

Each config is built with ``transformers`` (the reference oracle), its weights re-drawn at a scale
where every layer visibly changes the residual stream (HF's init std 0.02 would leave the layers
nearly silent), then written with ``save_pretrained``. Built once per session.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig, Qwen3_5TextConfig

from engine.model import (
    ForwardBatch,
    ModelCache,
    ModelConfig,
    build_model,
    collect_weights,
    make_forward_batch,
)
from engine.model.qwen3_5 import Qwen3_5ForCausalLM as OurModel

TINY_CONFIGS = {
    # dense: 3 q heads over 1 kv head, GDN 2 key heads -> 4 value heads, rotary 10 of 40
    "dense_a": (Qwen3_5TextConfig, Qwen3_5ForCausalLM, dict(
        vocab_size=1000, hidden_size=72, intermediate_size=136, num_hidden_layers=8, num_attention_heads=3,
        num_key_value_heads=1, head_dim=40, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=24, linear_value_head_dim=20)),
    # dense: GDN value/key ratio 3 (as 27B), conv kernel 3, full attention every 3rd layer, mrope sections
    "dense_b": (Qwen3_5TextConfig, Qwen3_5ForCausalLM, dict(
        vocab_size=1500, hidden_size=60, intermediate_size=100, num_hidden_layers=9, num_attention_heads=4,
        num_key_value_heads=2, head_dim=48, linear_num_key_heads=1, linear_num_value_heads=3,
        linear_key_head_dim=20, linear_value_head_dim=28, linear_conv_kernel_dim=3,
        layer_types=["linear_attention", "linear_attention", "full_attention"] * 3,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25,
                         "mrope_section": [2, 2, 2], "mrope_interleaved": True})),
    "moe_a": (Qwen3_5MoeTextConfig, Qwen3_5MoeForCausalLM, dict(
        vocab_size=1000, hidden_size=72, num_hidden_layers=8, num_attention_heads=3, num_key_value_heads=1,
        head_dim=40, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=24,
        linear_value_head_dim=20, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=28,
        shared_expert_intermediate_size=36)),
    # MoE with tied embeddings (no lm_head.weight in the checkpoint), 10 experts top-3
    "moe_b": (Qwen3_5MoeTextConfig, Qwen3_5MoeForCausalLM, dict(
        vocab_size=1200, hidden_size=56, num_hidden_layers=10, num_attention_heads=2, num_key_value_heads=2,
        head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=24, num_experts=10, num_experts_per_tok=3, moe_intermediate_size=20,
        shared_expert_intermediate_size=44, tie_word_embeddings=True)),
    # dense with every NVFP4 site's rows a multiple of 128 and K of 64 (the nvfp4 profiles' tiny models)
    "dense_q": (Qwen3_5TextConfig, Qwen3_5ForCausalLM, dict(
        vocab_size=1000, hidden_size=128, intermediate_size=192, num_hidden_layers=8, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=32, linear_value_head_dim=32)),
}  # fmt: skip


@dataclass
class TinyCheckpoint:
    name: str
    path: Path
    hf_model: torch.nn.Module
    hf_config: dict
    config: ModelConfig
    tensors: dict[str, torch.Tensor]  # as written by save_pretrained

    def convert_and_load(self, out: Path) -> OurModel:
        """The user's path: `ninfer-artifact convert` (the real CLI entry point) then `load_model`."""
        from engine.artifact.cli import main as artifact_cli
        from engine.artifact.container import read_artifact
        from engine.model import load_model

        model_id = "ninfer-tiny-moe" if "moe" in self.name else "ninfer-tiny-dense"
        argv = ["convert", str(self.path), str(out), "--model-id", model_id, "--weights-id", "fp32"]
        assert artifact_cli(argv) == 0
        return load_model(read_artifact(out), dtype=torch.float32)

    def build(self, with_mtp: bool = False, extra: dict[str, torch.Tensor] | None = None) -> OurModel:
        source = {**self.tensors, **(extra or {})}
        collected = collect_weights(source, source.__getitem__, self.config, with_mtp)
        return build_model(self.config, collected, with_mtp=with_mtp)


def _randomise(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=gen) * 2.5 - 1.0)
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
            elif "norm" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.08)


def _build(name: str, root: Path) -> TinyCheckpoint:
    config_cls, model_cls, kwargs = TINY_CONFIGS[name]
    torch.manual_seed(0)
    hf_model = model_cls(config_cls(**kwargs)).eval()
    _randomise(hf_model, seed=len(name) * 7919)
    path = root / name
    hf_model.save_pretrained(path)
    hf_config = json.loads((path / "config.json").read_text())
    tensors = load_file(path / "model.safetensors")
    return TinyCheckpoint(name, path, hf_model, hf_config, ModelConfig.from_hf(hf_config), tensors)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """tiny(name) -> TinyCheckpoint, built once per session."""
    root = tmp_path_factory.mktemp("tiny_hf")
    built: dict[str, TinyCheckpoint] = {}

    def get(name: str) -> TinyCheckpoint:
        if name not in built:
            built[name] = _build(name, root)
        return built[name]

    return get


@dataclass
class Lane:
    """One sequence's bookkeeping for tests: its tokens so far, its pages and its state slot."""

    slot: int
    pages: list[int] = field(default_factory=list)
    num_cached: int = 0


class Driver:
    """Hands out shuffled pages and builds ForwardBatches, as the engine's runner will."""

    def __init__(self, cache: ModelCache, seed: int = 0) -> None:
        self.cache = cache
        gen = torch.Generator().manual_seed(seed)
        self.free = torch.randperm(cache.num_pages, generator=gen).tolist()

    def batch(self, lanes: list[Lane], chunks: list[list[int]]) -> ForwardBatch:
        size = self.cache.page_size
        for lane, chunk in zip(lanes, chunks, strict=True):
            while len(lane.pages) * size < lane.num_cached + len(chunk):
                lane.pages.append(self.free.pop())
        batch = make_forward_batch(chunks, [lane.num_cached for lane in lanes], [lane.pages for lane in lanes],
                                   [lane.slot for lane in lanes], page_size=size)  # fmt: skip
        for lane, chunk in zip(lanes, chunks, strict=True):
            lane.num_cached += len(chunk)
        return batch


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.inference_mode():
        yield


@pytest.fixture
def paged():
    """(Driver, Lane) classes for building paged batches in tests."""
    return Driver, Lane
