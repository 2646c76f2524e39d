"""Gated full attention (Qwen3.5 ``self_attn``) over the paged KV cache.

``q_proj`` emits, per head, the query followed by an output gate of the same width. Query and key
get a per-head ``(1 + w)`` RMSNorm, then partial RoPE; new K/V are stored into their pages, then
each new token attends causally to its sequence's pages; the output is multiplied by
``sigmoid(gate)`` before ``o_proj`` (``sigmoid_gate_mul``: one Triton pass on CUDA reading the gate view in
place, fp32 math rounded once). Reads only the ForwardBatch and its own cache entry.

The input projections are ``Linear`` layers (``engine.model.linear``) named by ``input_projections``, each
with named outputs: the checkpoint's q_proj (``query_gate``: per head [query | gate], HF's interleave),
k_proj (``key``), v_proj (``value``). ``fuse_projections()`` (called once after loading, see
``Qwen3_5ForCausalLM.fuse_projections``) replaces them by one ``qkv_proj`` with the three outputs: one GEMM,
whose output is split into views (query/gate [T, H, 2D], key and value [T, H_kv, D] with the fused row
stride); the q/k norms and ``store_kv`` read those strided views in place (no copy). A quantized artifact's
parents carry ``query`` and ``gate`` as separate outputs instead (27B groupwise: ``query_key`` [query, key]
and ``gate_value`` [gate, value]; one ``query_key_gate_value`` elsewhere); the layer reads either form.

The q/k norms, the RoPE and the store run as ``qk_norm_rope_store``: four launches (``rms_norm`` twice,
``apply_rope_qk``, ``store_kv``), or under ``NINFER_ATTN_FUSE=on`` with a float cache one (the key goes from
registers into its page; bitwise the four), and decode's output gate then rides in the split-K reduce.

Paths (chosen from shapes only, so attention never syncs with the host):
- decode (every sequence brings one token, ``T == B``), float or int8 KV: ``store_kv`` +
  ``paged_attention_decode`` (Triton split-K over the pages on CUDA, batch-invariant).
- prefill and mixed steps, float or int8 KV: ``store_kv`` + ``paged_prefill_attention`` (on CUDA one
  Triton FlashAttention-2 launch for the whole varlen batch, reading K/V straight from the pages: fresh
  prompts, chunks continuing a cached prefix and decode rows alike; GQA without repeating K/V).
  NOTE: fresh prompts take the kernel too, not torch's flash SDPA: telling them apart needs the
  sequence lengths on the host (a sync every attention layer), and one launch serves a mixed batch.
Off CUDA both launchers run their torch reference (``paged_attention_ref``).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.model.config import ModelConfig
from engine.model.forward import ForwardBatch, ModelCache
from engine.model.fusion import concat_linears
from engine.model.linear import Linear, bound_inputs
from engine.model.norm import RMSNorm
from kernels.activation import sigmoid_gate_mul
from kernels.attention import paged_attention_decode, paged_prefill_attention, qk_norm_rope_store


class GatedAttention(nn.Module):
    def __init__(self, config: ModelConfig, kv_index: int) -> None:
        super().__init__()
        self.kv_index = kv_index  # which entry of ModelCache.key_cache / value_cache this layer owns
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        hidden = config.hidden_size
        q_rows, kv_rows = 2 * self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_proj = Linear(hidden, q_rows, [("query_gate", q_rows)])
        self.k_proj = Linear(hidden, kv_rows, [("key", kv_rows)])
        self.v_proj = Linear(hidden, kv_rows, [("value", kv_rows)])
        self.qkv_proj: Linear | None = None  # q_proj | k_proj | v_proj once fused
        # the attributes holding the current input projections (the loader of a quantized artifact sets its own)
        self.input_projections: tuple[str, ...] = ("q_proj", "k_proj", "v_proj")
        self.o_proj = Linear(self.num_heads * self.head_dim, hidden)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]
        rope: tuple[torch.Tensor, torch.Tensor],  # cos, sin: [T, rotary_dim]
        batch: ForwardBatch,
        cache: ModelCache,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        query, gate, k, v = self._project(x)
        kv_shape = (num_tokens, self.num_kv_heads, self.head_dim)
        cos, sin = rope
        key_cache, value_cache = cache.key_cache[self.kv_index], cache.value_cache[self.kv_index]
        key_scale = cache.key_scale[self.kv_index] if cache.key_scale is not None else None
        value_scale = cache.value_scale[self.kv_index] if cache.value_scale is not None else None
        # q/k norms, RoPE, K/V into the pages: one launch under NINFER_ATTN_FUSE=on (float KV), else four
        query = qk_norm_rope_store(
            query, k.view(kv_shape), v.view(kv_shape), self.q_norm.weight, self.k_norm.weight, self.q_norm.eps,
            cos, sin, key_cache, value_cache, batch.slot_mapping, key_scale, value_scale,
        )  # fmt: skip
        if num_tokens == batch.num_sequences:  # decode, float or int8 KV (int8: dequantised in the kernel)
            # the output gate: in the split-K reduce under NINFER_ATTN_FUSE=on, else sigmoid_gate_mul after it
            out = paged_attention_decode(
                query, key_cache, value_cache, batch.page_table, batch.seq_lens, self.scale, key_scale,
                value_scale, gate,
            )  # fmt: skip
        else:  # prefill / mixed, float or int8 KV
            out = paged_prefill_attention(
                query,
                key_cache,
                value_cache,
                batch.page_table,
                batch.query_start_loc,
                batch.seq_lens,
                self.scale,
                key_scale,
                value_scale,
            )
            out = sigmoid_gate_mul(out, gate)  # one pass; gate read in place from the projection output
        return self.o_proj(out.reshape(num_tokens, -1))

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(query [T, H, D], gate [T, H, D], k [T, H_kv * D], v [T, H_kv * D]): views of the projections'
        outputs (one GEMM once fused)."""
        num_tokens = x.shape[0]
        parts = bound_inputs(self, _input_groups).run(x)
        if len(parts) == 3:  # HF's interleave: per head [query | gate]
            query_gate, k, v = parts
            query, gate = query_gate.view(num_tokens, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
            return query, gate, k, v
        query, gate, k, v = parts
        shape = (num_tokens, self.num_heads, self.head_dim)
        return query.view(shape), gate.view(shape), k, v

    def fuse_projections(self) -> bool:
        """Replace q_proj, k_proj, v_proj by one ``qkv_proj`` (their weights concatenated, the originals
        dropped). Returns False (and changes nothing) when already fused."""
        if self.input_projections != ("q_proj", "k_proj", "v_proj"):
            return False
        self.qkv_proj = concat_linears(self.q_proj, self.k_proj, self.v_proj)
        del self.q_proj, self.k_proj, self.v_proj
        self.input_projections = ("qkv_proj",)
        return True


def _input_groups(names: set[str]) -> tuple[tuple[str], ...]:
    """What attention reads from its input projections: the checkpoint's per-head [query | gate] rows when the
    parents have them, else query and gate apart (a quantized artifact's parents), then key and value."""
    if "query_gate" in names:
        return ("query_gate",), ("key",), ("value",)
    return ("query",), ("gate",), ("key",), ("value",)
