"""Kernels: one module per op family. Each op has a pure-torch ``<op>_ref`` (the specification,
float32 math, runs on the CPU); Triton launchers join them beside their references on the GPU.

This package imports nothing from ``engine``, ``api`` or ``monitor``.
"""

from __future__ import annotations

from kernels.attention import gather_kv_ref, paged_attention_ref, store_kv_ref
from kernels.conv import causal_conv1d_ref, causal_conv1d_update_ref, causal_conv1d_varlen_ref
from kernels.gdn import (
    chunk_gated_delta_rule_ref,
    gated_delta_rule_varlen_ref,
    l2norm_ref,
    recurrent_gated_delta_rule_ref,
)
from kernels.moe import moe_experts_ref, moe_route_ref
from kernels.norm import gated_rms_norm_ref, rms_norm_ref
from kernels.rope import apply_rope_ref, mrope_axis_map_ref, rope_cos_sin_ref, rope_inv_freq_ref

__all__ = [
    "apply_rope_ref",
    "causal_conv1d_ref",
    "causal_conv1d_update_ref",
    "causal_conv1d_varlen_ref",
    "chunk_gated_delta_rule_ref",
    "gather_kv_ref",
    "gated_delta_rule_varlen_ref",
    "gated_rms_norm_ref",
    "l2norm_ref",
    "moe_experts_ref",
    "moe_route_ref",
    "mrope_axis_map_ref",
    "paged_attention_ref",
    "recurrent_gated_delta_rule_ref",
    "rms_norm_ref",
    "rope_cos_sin_ref",
    "rope_inv_freq_ref",
    "store_kv_ref",
]
