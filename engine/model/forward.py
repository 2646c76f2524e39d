"""The forward context: one flat varlen batch (vLLM style) and the cache tensors the model writes.

A batch holds the new tokens of B sequences back to back; the same layout covers prefill chunks,
decode tokens and mixed batches (no prefill/decode flag):

    tokens      [ seq 0 chunk ....... | seq 1 (1 decode token) | seq 2 chunk ... ]
    query_start_loc  0                 q0                       q0+1               T

For sequence ``b``: ``seq_lens[b]`` = tokens already cached + its new tokens; its KV pages are
``page_table[b, :]``; its GDN conv/recurrent state is slot ``state_slots[b]`` of every GDN layer,
continued from the saved state when ``has_initial_state[b]`` else started from zeros.

The model receives a ``ForwardBatch`` and a ``ModelCache`` explicitly (STYLE 2.2 rule 6: no globals);
layers read only these plain tensors and never see requests. The cache (``ModelCache``,
engine/cache/kv.py) is a plain dataclass of tensors: its shapes and ownership of pages and slots belong
to ``engine/cache``, the writes to the model; ``kv_spec`` turns a ``ModelConfig`` into its ``KVSpec``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.cache.kv import KVDtype, KVSpec, ModelCache, allocate_cache
from engine.model.config import ModelConfig
from kernels.attention import kv_int8_group_size

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "ForwardBatch",
    "ModelCache",
    "allocate_model_cache",
    "kv_spec",
    "make_forward_batch",
]

DEFAULT_PAGE_SIZE = 64


@dataclass(frozen=True)
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64, or [3, T] for multimodal (mrope) positions
    query_start_loc: torch.Tensor  # [B + 1] int32, cu_seqlens_q
    seq_lens: torch.Tensor  # [B] int32, cached + new tokens per sequence
    page_table: torch.Tensor  # [B, max_pages] int32
    slot_mapping: torch.Tensor  # [T] int64, page * page_size + row; -1 = padding (not stored)
    state_slots: torch.Tensor  # [B] int64, GDN state slot per sequence
    has_initial_state: torch.Tensor  # [B] bool, continue from the slot's saved state
    # Host copies of the three above, when the batch was built from host lists (``make_forward_batch``):
    # layers that need them as Python ints (the per-sequence GDN prefill) read these instead of a
    # ``.tolist()``, which would wait for the GPU to drain every layer. None in graph-captured batches.
    query_start_loc_cpu: tuple[int, ...] | None = None
    state_slots_cpu: tuple[int, ...] | None = None
    has_initial_state_cpu: tuple[bool, ...] | None = None
    # Speculative verify (engine/spec): every sequence feeds exactly ``verify_width`` tokens, and the GDN
    # layers run them one position at a time (the decode ops, bit-identical to decoding them one per step),
    # writing each sequence's state after position j < width - 1 into slot ``snapshot_slots[b, j]``
    # ([B, width - 1] int64; -1 in a padding row, whose state slot is -1) and after the last position into
    # its state slot, so the runner can roll back to the last accepted position. 0 = off.
    verify_width: int = 0
    snapshot_slots: torch.Tensor | None = None
    # Vision (engine/runner/media.py): the tower's rows [M, hidden] for the M placeholder tokens of this batch,
    # in token order, and the mask [T] bool of those tokens; the embedding output takes them there. None: text.
    media_embeds: torch.Tensor | None = None
    media_mask: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    @property
    def num_sequences(self) -> int:
        return self.seq_lens.shape[0]

    def last_token_indices(self) -> torch.Tensor:
        """Row of each sequence's last new token -> [B] (the rows whose logits sample the next token)."""
        return (self.query_start_loc[1:] - 1).long()

    def host_layout(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[bool, ...]]:
        """(query_start_loc, state_slots, has_initial_state) as host tuples: the mirrors when present,
        else read back from the device (one sync)."""
        if (
            self.query_start_loc_cpu is not None
            and self.state_slots_cpu is not None
            and self.has_initial_state_cpu is not None
        ):
            return self.query_start_loc_cpu, self.state_slots_cpu, self.has_initial_state_cpu
        return (
            tuple(self.query_start_loc.tolist()),
            tuple(self.state_slots.tolist()),
            tuple(self.has_initial_state.tolist()),
        )


def make_forward_batch(
    new_tokens: Sequence[Sequence[int]],
    num_cached: Sequence[int],
    page_ids: Sequence[Sequence[int]],
    state_slots: Sequence[int],
    page_size: int = DEFAULT_PAGE_SIZE,
    has_initial_state: Sequence[bool] | None = None,
    device: torch.device | str = "cpu",
) -> ForwardBatch:
    """Build a text-only batch from plain lists (positions are ``num_cached .. num_cached + n - 1``).

    ``page_ids[b]`` must cover all ``num_cached[b] + len(new_tokens[b])`` tokens; ``has_initial_state``
    defaults to ``num_cached[b] > 0``.
    """
    if not (len(new_tokens) == len(num_cached) == len(page_ids) == len(state_slots)):
        raise ValueError(
            "make_forward_batch: new_tokens, num_cached, page_ids and state_slots differ in length"
        )
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    starts = [0]
    for tokens, cached, pages in zip(new_tokens, num_cached, page_ids, strict=True):
        total = cached + len(tokens)
        if len(pages) * page_size < total:
            raise ValueError(
                f"make_forward_batch: {len(pages)} pages of {page_size} cannot hold {total} tokens"
            )
        ids.extend(tokens)
        for pos in range(cached, total):
            positions.append(pos)
            slots.append(pages[pos // page_size] * page_size + pos % page_size)
        starts.append(len(ids))
    max_pages = max((len(p) for p in page_ids), default=0)
    table = [list(p) + [0] * (max_pages - len(p)) for p in page_ids]
    cont = [c > 0 for c in num_cached] if has_initial_state is None else list(has_initial_state)
    return ForwardBatch(
        input_ids=torch.tensor(ids, dtype=torch.int64, device=device),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(
            [c + len(t) for c, t in zip(num_cached, new_tokens, strict=True)],
            dtype=torch.int32,
            device=device,
        ),  # fmt: skip
        page_table=torch.tensor(table, dtype=torch.int32, device=device).reshape(len(page_ids), max_pages),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        state_slots=torch.tensor(list(state_slots), dtype=torch.int64, device=device),
        has_initial_state=torch.tensor(cont, dtype=torch.bool, device=device),
        query_start_loc_cpu=tuple(starts),
        state_slots_cpu=tuple(state_slots),
        has_initial_state_cpu=tuple(bool(c) for c in cont),
    )


def kv_spec(
    config: ModelConfig, dtype: torch.dtype, kv_dtype: KVDtype = "bf16", *, with_mtp: bool = False
) -> KVSpec:
    """The cache geometry of `config` (engine/cache/kv.py): every attention layer, plus the MTP layers
    when asked, and every GDN layer; K/V in `dtype` ("bf16") or int8 codes with fp16 group scales."""
    return KVSpec(
        num_kv_layers=config.num_attention_layers + (config.mtp_num_hidden_layers if with_mtp else 0),
        num_kv_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        num_gdn_layers=config.num_linear_layers,
        conv_shape=(config.conv_dim, config.linear_conv_kernel_dim - 1),
        recurrent_shape=(
            config.linear_num_value_heads,
            config.linear_key_head_dim,
            config.linear_value_head_dim,
        ),
        dtype=dtype,
        kv_dtype=kv_dtype,
        int8_group_size=kv_int8_group_size(config.head_dim) if kv_dtype == "int8" else config.head_dim,
    )


def allocate_model_cache(
    config: ModelConfig,
    num_pages: int,
    page_size: int = DEFAULT_PAGE_SIZE,
    num_state_slots: int = 1,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
    with_mtp: bool = False,
    kv_dtype: KVDtype = "bf16",
) -> ModelCache:
    """Zeroed cache tensors for `config` (``kv_spec``; `kv_dtype` as `CacheConfig` spells it)."""
    return allocate_cache(kv_spec(config, dtype, kv_dtype, with_mtp=with_mtp), num_pages, page_size, num_state_slots,
                          device)  # fmt: skip
