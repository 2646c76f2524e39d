"""The Qwen3.5-family model (dense and MoE, with the MTP head) in PyTorch.

Layers take plain tensors plus a ``ForwardBatch`` and a ``ModelCache``; they never see requests. Every
projection (attention q/k/v and o_proj, GDN in/out_proj, MLP gate_up/down, MoE router and shared-expert gate,
MTP fc, lm_head) is a ``linear.Linear`` that owns its weight and the method applying it; model code calls the
layer. A dense weight runs ``kernels.linear.linear``: ``F.linear`` (cuBLAS on CUDA) by default, the Triton
GEMV for decode-sized batches (at most 8 rows) on CUDA under ``NINFER_GEMV=on|auto``.
"""

from __future__ import annotations

from engine.model.config import ModelConfig
from engine.model.forward import ForwardBatch, ModelCache, allocate_model_cache, make_forward_batch
from engine.model.loader import build_model, load_model
from engine.model.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM
from engine.model.weights import WeightInventoryError, collect_weights, expected_weights, normalize_name

__all__ = [
    "ForwardBatch",
    "ModelCache",
    "ModelConfig",
    "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM",
    "WeightInventoryError",
    "allocate_model_cache",
    "build_model",
    "collect_weights",
    "expected_weights",
    "load_model",
    "make_forward_batch",
    "normalize_name",
]
