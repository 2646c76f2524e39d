"""Kernels: one module per op family. Each op has a pure-torch ``<op>_ref`` (the specification,
float32 math, runs on the CPU); a Triton launcher ``<op>`` sits beside its reference where one pays,
with the same contract, and runs the reference itself off CUDA or under ``NINFER_KERNELS=ref``
(``kernels._dispatch``).

This package imports nothing from ``engine``, ``api`` or ``monitor``.
"""

from __future__ import annotations

from kernels.activation import sigmoid_gate_mul, sigmoid_gate_mul_ref, silu_mul, silu_mul_ref
from kernels.attention import (
    gather_kv_ref,
    paged_attention_decode,
    paged_attention_decode_ref,
    paged_attention_ref,
    paged_prefill_attention,
    paged_prefill_attention_ref,
    qk_norm_rope_store,
    qk_norm_rope_store_ref,
    store_kv,
    store_kv_ref,
)
from kernels.conv import (
    causal_conv1d_decode,
    causal_conv1d_decode_ref,
    causal_conv1d_ref,
    causal_conv1d_update_ref,
    causal_conv1d_varlen,
    causal_conv1d_varlen_ref,
    causal_conv1d_varlen_split,
    causal_conv1d_varlen_split_ref,
)
from kernels.gdn import (
    chunk_gated_delta_rule,
    chunk_gated_delta_rule_ref,
    gated_delta_rule_decode,
    gated_delta_rule_decode_ref,
    gated_delta_rule_varlen_ref,
    gdn_gate_ref,
    l2norm_ref,
    recurrent_gated_delta_rule_ref,
)
from kernels.linear import linear, linear_ref
from kernels.moe import moe_combine, moe_combine_ref, moe_experts, moe_experts_ref, moe_route, moe_route_ref
from kernels.norm import (
    add_rms_norm,
    add_rms_norm_ref,
    gated_rms_norm,
    gated_rms_norm_ref,
    rms_norm,
    rms_norm_ref,
)
from kernels.quant import quant_linear, quant_linear_ref, quant_moe_experts, quant_moe_experts_ref
from kernels.rope import (
    apply_rope_qk,
    apply_rope_qk_ref,
    apply_rope_ref,
    mrope_axis_map_ref,
    rope_cos_sin_ref,
    rope_inv_freq_ref,
)
from kernels.state_copy import copy_state_slots, copy_state_slots_ref

__all__ = [
    "add_rms_norm",
    "add_rms_norm_ref",
    "apply_rope_qk",
    "apply_rope_qk_ref",
    "apply_rope_ref",
    "causal_conv1d_decode",
    "causal_conv1d_decode_ref",
    "causal_conv1d_ref",
    "causal_conv1d_update_ref",
    "causal_conv1d_varlen",
    "causal_conv1d_varlen_ref",
    "causal_conv1d_varlen_split",
    "causal_conv1d_varlen_split_ref",
    "chunk_gated_delta_rule",
    "chunk_gated_delta_rule_ref",
    "copy_state_slots",
    "copy_state_slots_ref",
    "gated_delta_rule_decode",
    "gated_delta_rule_decode_ref",
    "gated_delta_rule_varlen_ref",
    "gated_rms_norm",
    "gated_rms_norm_ref",
    "gather_kv_ref",
    "gdn_gate_ref",
    "l2norm_ref",
    "linear",
    "linear_ref",
    "moe_combine",
    "moe_combine_ref",
    "moe_experts",
    "moe_experts_ref",
    "moe_route",
    "moe_route_ref",
    "mrope_axis_map_ref",
    "paged_attention_decode",
    "paged_attention_decode_ref",
    "paged_attention_ref",
    "paged_prefill_attention",
    "paged_prefill_attention_ref",
    "qk_norm_rope_store",
    "qk_norm_rope_store_ref",
    "quant_linear",
    "quant_linear_ref",
    "quant_moe_experts",
    "quant_moe_experts_ref",
    "recurrent_gated_delta_rule_ref",
    "rms_norm",
    "rms_norm_ref",
    "rope_cos_sin_ref",
    "rope_inv_freq_ref",
    "sigmoid_gate_mul",
    "sigmoid_gate_mul_ref",
    "silu_mul",
    "silu_mul_ref",
    "store_kv",
    "store_kv_ref",
]
