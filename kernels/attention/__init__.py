"""Paged attention references: store K/V into pages, causal varlen GQA attention reading pages.

KV cache layout (one attention layer): ``key_cache`` and ``value_cache`` are
``[num_pages, page_size, num_kv_heads, head_dim]``. Token ``i`` of sequence ``b`` (its absolute
position, counting cached tokens) lives in page ``page_table[b, i // page_size]`` at row
``i % page_size``; ``slot_mapping[t] = page * page_size + row`` is where new token ``t`` is written
(``-1`` = padding, skipped).

A batch is flat (varlen): sequence ``b`` owns query rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]``
and has ``seq_lens[b]`` tokens in total (cached + new), so its new tokens sit at absolute positions
``seq_lens[b] - q_len .. seq_lens[b] - 1`` and each attends to every key at or before its own position.

INT8 KV: a quantised cache stores int8 codes in the same layout plus one fp16 scale per group of
``KV_INT8_GROUP`` (64) values along ``head_dim`` (``[num_pages, page_size, Hkv, head_dim // group]``;
a head_dim under 64 is one group). ``scale = absmax / 127`` per group, ``code = round(x / scale)``.
``store_kv_ref`` quantises when it is given the scale tensors, and every page read goes through
``gather_kv_ref``, which dequantises there: the attention math never sees codes. The Triton
``store_kv`` quantises the same way (bit-exact), and the Triton decode kernel dequantises each K/V tile
in registers (codes times the group's scale in fp32, then the query dtype for the tensor-core dots).

Prefill (and mixed steps): ``paged_prefill_attention`` runs ``paged_attention_ref``'s contract as one
FlashAttention-2 launch over the flat varlen batch, reading K/V straight from the pages (no gather, no
K/V repeated per query head; int8 pages dequantised in registers), with no host sync.

Decode is batch-invariant: ``paged_attention_decode`` cuts a sequence's keys into splits by a rule of
that sequence's length alone and merges them in a fixed order, so a sequence's output is bitwise the
same whichever other sequences (or padding rows) share its batch and however wide the page table is.

Files: ``ref.py`` (the contract: ``gather_kv_ref``, ``paged_attention_ref``), ``int8.py`` (the int8 codec and
its Triton helpers), ``store.py`` (``store_kv``), ``decode.py`` (``paged_attention_decode``), ``decode_int8.py``
(its ``int8_grouped`` kernel: int8 KV with the scales applied to the dots' results, and that kernel's keys-major
build), ``prefill.py``
(``paged_prefill_attention``); each launcher's ``_ref`` sits beside it. Import from ``kernels.attention``.
"""

from __future__ import annotations

from kernels.attention.decode import (
    DECODE_MAX_SPLITS,
    decode_block_n,
    decode_split_tokens,
    paged_attention_decode,
    paged_attention_decode_ref,
)
from kernels.attention.decode import (
    NEW_DEFAULTS as DECODE_NEW_DEFAULTS,
)
from kernels.attention.int8 import (
    KV_INT8_GROUP,
    dequantize_kv_int8_ref,
    kv_int8_group_size,
    quantize_kv_int8_ref,
)
from kernels.attention.prefill import (
    PrefillTiles,
    _launch_paged_prefill_attention,
    paged_prefill_attention,
    paged_prefill_attention_ref,
    prefill_tiles,
)
from kernels.attention.ref import gather_kv_ref, paged_attention_ref
from kernels.attention.store import store_kv, store_kv_ref

__all__ = [
    "DECODE_MAX_SPLITS",
    "DECODE_NEW_DEFAULTS",
    "KV_INT8_GROUP",
    "PrefillTiles",
    "_launch_paged_prefill_attention",
    "decode_block_n",
    "decode_split_tokens",
    "dequantize_kv_int8_ref",
    "gather_kv_ref",
    "kv_int8_group_size",
    "paged_attention_decode",
    "paged_attention_decode_ref",
    "paged_attention_ref",
    "paged_prefill_attention",
    "paged_prefill_attention_ref",
    "prefill_tiles",
    "quantize_kv_int8_ref",
    "store_kv",
    "store_kv_ref",
]
