"""Gated full attention (Qwen3.5 ``self_attn``) over the paged KV cache.

``q_proj`` emits, per head, the query followed by an output gate of the same width. Query and key
get a per-head ``(1 + w)`` RMSNorm, then partial RoPE; new K/V are stored into their pages, then
each new token attends causally to its sequence's pages; the output is multiplied by
``sigmoid(gate)`` before ``o_proj``. Reads only the ForwardBatch and its own cache entry.

Paths (chosen from shapes only, so a decode step never syncs with the host):
- decode (every sequence brings one token, ``T == B``), float or int8 KV: ``store_kv`` +
  ``paged_attention_decode`` (Triton split-K over the pages on CUDA, batch-invariant; its reference
  elsewhere).
- prefill / mixed on CUDA with a float KV cache: ``store_kv``, then per sequence torch SDPA (flash)
  over the chunk's own K/V when nothing was cached before it, or over the sequence's gathered pages
  with a bottom-right causal mask when it continues a cached prefix.
- everything else (the CPU, int8 KV prefill): ``paged_attention_ref``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.bias import causal_lower_right

from engine.model.config import ModelConfig
from engine.model.forward import ForwardBatch, ModelCache
from engine.model.norm import RMSNorm
from kernels.attention import paged_attention_decode, paged_attention_ref, store_kv
from kernels.rope import apply_rope_qk


class GatedAttention(nn.Module):
    def __init__(self, config: ModelConfig, kv_index: int) -> None:
        super().__init__()
        self.kv_index = kv_index  # which entry of ModelCache.key_cache / value_cache this layer owns
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, 2 * self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=False)
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
        query, gate = self.q_proj(x).view(num_tokens, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        query = self.q_norm(query)
        key = self.k_norm(self.k_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim))
        value = self.v_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)
        cos, sin = rope
        query, key = apply_rope_qk(query, key, cos, sin)  # in place: both are fresh norm outputs
        key_cache, value_cache = cache.key_cache[self.kv_index], cache.value_cache[self.kv_index]
        key_scale = cache.key_scale[self.kv_index] if cache.key_scale is not None else None
        value_scale = cache.value_scale[self.kv_index] if cache.value_scale is not None else None
        store_kv(key, value, key_cache, value_cache, batch.slot_mapping, key_scale, value_scale)
        if num_tokens == batch.num_sequences:  # decode, float or int8 KV (int8: dequantised in the kernel)
            out = paged_attention_decode(
                query,
                key_cache,
                value_cache,
                batch.page_table,
                batch.seq_lens,
                self.scale,
                key_scale,
                value_scale,
            )
        elif query.is_cuda and key_scale is None:
            out = self._prefill_sdpa(query, key, value, key_cache, value_cache, batch)
        else:
            out = paged_attention_ref(
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
        out = out * torch.sigmoid(gate.float()).to(out.dtype)
        return self.o_proj(out.reshape(num_tokens, -1))

    def _prefill_sdpa(
        self,
        query: torch.Tensor,  # [T, Hq, D]
        key: torch.Tensor,  # [T, Hkv, D], the new tokens (already stored)
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        """Causal attention per sequence with torch SDPA; syncs once for the sequence bounds."""
        bounds, lens = batch.query_start_loc.tolist(), batch.seq_lens.tolist()
        page_size = key_cache.shape[1]
        group = self.num_heads // self.num_kv_heads
        out = torch.empty_like(query)
        for b, total in enumerate(lens):
            start, end = bounds[b], bounds[b + 1]
            if end == start:
                continue
            q = query[start:end].transpose(0, 1).unsqueeze(0)  # [1, Hq, q_len, D]
            if total == end - start:  # nothing cached before this chunk: attend to its own K/V
                k = key[start:end].transpose(0, 1).unsqueeze(0)
                v = value[start:end].transpose(0, 1).unsqueeze(0)
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale, enable_gqa=True)
            else:
                pages = batch.page_table[b, : -(-total // page_size)].long()
                k, v = (
                    c[pages]
                    .flatten(0, 1)[:total]
                    .transpose(0, 1)
                    .repeat_interleave(group, dim=0)
                    .unsqueeze(0)
                    for c in (key_cache, value_cache)
                )
                mask = causal_lower_right(end - start, total)
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
            out[start:end] = o[0].transpose(0, 1)
        return out
