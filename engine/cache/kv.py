"""The device cache tensors: the paged KV pool and the GDN state slots (`ModelCache`), and their size.

Owns: the shapes and dtypes of every cache tensor, built from a small `KVSpec` (layers, KV heads,
head_dim, dtypes, the int8 group size, GDN state shapes) rather than from the model's config, so this
package never imports engine.model (`.importlinter`); the model builds the spec from its config
(`engine.model.forward.kv_spec`). Also owns the one page-bytes formula (`KVSpec.page_bytes`) and the
page count `--kv-capacity` resolves to (`resolve_num_pages`). Must not touch: which page or slot holds
what (engine/cache/pages.py, state.py), the writes (the model's layers), requests.

`kv_dtype` is the user's word, validated once in `CacheConfig` (`bf16 | int8`): "bf16" keeps K/V in
the model's compute dtype (bf16 on the GPU; float32 in CPU tests), "int8" stores int8 codes plus one
fp16 scale per `int8_group_size` values along head_dim.

    key_cache[i], value_cache[i]    [num_pages, page_size, num_kv_heads, head_dim]   (i: attention layer,
    key_scale[i], value_scale[i]    [num_pages, page_size, num_kv_heads, head_dim / group]  then MTP)
    conv_state[j]                   [num_slots, conv_dim, conv_kernel - 1]  model dtype (j: GDN layer)
    recurrent_state[j]              [num_slots, Hv, Dk, Dv]  fp32
    slot_extras[n]                  [num_slots, ...]  per-slot state a drafter adds (the MTP continuation
                                    hidden state, engine/spec/mtp.py): copied, checkpointed and host-parked
                                    with the GDN state of the same slot

`allocate_cache` makes the GDN state lists views of one `[num_gdn_layers, num_slots, ...]` tensor per kind
(`state_stacks`), so `copy_states` moves slots of every GDN layer in one gather and one scatter per kind (a
speculative rollback; `NINFER_ROLLBACK_COPY=skip`: one Triton copy per kind, `kernels/state_copy.py`) rather than
two kernels per layer tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.config import CacheConfig, KVDtype
from kernels.state_copy import copy_state_slots

CPU_AUTO_KV_BYTES = 256 * 1024**2  # `--kv-capacity auto` on the CPU: this much KV
GPU_HEADROOM_BYTES = 1024**3  # `--kv-capacity auto` on CUDA: leave this much free (plus 2%, sizing.py)


@dataclass(frozen=True)
class KVSpec:
    """What the cache tensors look like, in plain numbers (one page and one state slot)."""

    num_kv_layers: int  # attention layers that own a KV entry (with the MTP layers when allocated)
    num_kv_heads: int
    head_dim: int
    num_gdn_layers: int
    conv_shape: tuple[int, int]  # per slot: (conv_dim, conv_kernel - 1), in `dtype`
    recurrent_shape: tuple[int, int, int]  # per slot: (Hv, Dk, Dv), fp32
    dtype: torch.dtype  # the model's compute dtype: K/V with kv_dtype "bf16", the conv state
    kv_dtype: KVDtype = "bf16"
    int8_group_size: int = 64  # values per fp16 scale along head_dim (int8 only)
    # device bytes a token of caches kept beside the model cache and sized by its pages (the DFlash drafter's
    # context K/V: engine/spec/dflash_draft.py); counted in page_bytes so the pool's sizing leaves room for them
    companion_bytes_per_token: int = 0

    @property
    def num_int8_groups(self) -> int:
        return self.head_dim // self.int8_group_size

    def page_bytes(self, page_size: int) -> int:
        """Device bytes of one KV page across every KV entry of this spec (K and V, plus int8 scales), and the
        companion caches' share of a page."""
        values = page_size * self.num_kv_heads * self.head_dim
        if self.kv_dtype == "int8":
            per_kv = values + page_size * self.num_kv_heads * self.num_int8_groups * 2  # codes + fp16 scales
        else:
            per_kv = values * torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_kv_layers * per_kv + page_size * self.companion_bytes_per_token


@dataclass
class ModelCache:
    """Device tensors the model reads and writes; nothing else (shapes in the module docstring).

    With int8 KV the attention layer hands ``key_scale`` / ``value_scale`` to ``store_kv`` (quantises)
    and to the attention kernels or references (dequantise where they read).
    """

    page_size: int
    key_cache: list[torch.Tensor]
    value_cache: list[torch.Tensor]
    conv_state: list[torch.Tensor]
    recurrent_state: list[torch.Tensor]
    # conv_state / recurrent_state are the per-layer views of these two stacks [num_gdn_layers, num_slots, ...]
    state_stacks: tuple[torch.Tensor, torch.Tensor]
    kv_dtype: KVDtype = "bf16"
    key_scale: list[torch.Tensor] | None = None  # int8 only, one per KV entry
    value_scale: list[torch.Tensor] | None = None
    slot_extras: list[torch.Tensor] = field(default_factory=list)  # per-slot drafter state (see above)

    @property
    def num_pages(self) -> int:
        return self.key_cache[0].shape[0] if self.key_cache else 0

    @property
    def num_state_slots(self) -> int:
        return self.conv_state[0].shape[0] if self.conv_state else 0

    @property
    def device(self) -> torch.device:
        return (self.conv_state or self.key_cache)[0].device

    def copy_state_slot(self, src: int, dst: int) -> None:
        """Every GDN layer's conv and recurrent state of slot `src` into slot `dst`: one copy a kind."""
        for stack in self.state_stacks:
            stack[:, dst].copy_(stack[:, src])

    def copy_states(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Every GDN layer's conv and recurrent state of slots `src` into slots `dst` ([N] int64 on the
        device; the dst slots distinct, and none of them the src of another entry: an entry may name one slot as
        both, its state then stays). No host sync. `kernels.state_copy.copy_state_slots`: under
        `NINFER_ROLLBACK_COPY=skip` on the GPU such an entry moves no byte (a speculative row that kept every draft)."""
        for stack in self.state_stacks:
            copy_state_slots(stack, src, dst)


def allocate_cache(
    spec: KVSpec, num_pages: int, page_size: int, num_state_slots: int = 1, device: torch.device | str = "cpu"
) -> ModelCache:
    """Zeroed cache tensors for every KV entry and GDN layer of `spec`."""
    if num_pages < 1 or page_size < 1 or num_state_slots < 1:
        raise ValueError(
            f"allocate_cache: num_pages={num_pages}, page_size={page_size}, "
            f"num_state_slots={num_state_slots}: all must be >= 1"
        )
    kv_shape = (num_pages, page_size, spec.num_kv_heads, spec.head_dim)
    int8 = spec.kv_dtype == "int8"
    kv_torch_dtype = torch.int8 if int8 else spec.dtype

    def zeros(shape: tuple[int, ...], dtype: torch.dtype, n: int) -> list[torch.Tensor]:
        return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n)]

    scale_shape = (*kv_shape[:3], spec.num_int8_groups)
    n = spec.num_gdn_layers
    conv = torch.zeros((n, num_state_slots, *spec.conv_shape), dtype=spec.dtype, device=device)
    recurrent = torch.zeros((n, num_state_slots, *spec.recurrent_shape), dtype=torch.float32, device=device)
    return ModelCache(
        page_size=page_size,
        key_cache=zeros(kv_shape, kv_torch_dtype, spec.num_kv_layers),
        value_cache=zeros(kv_shape, kv_torch_dtype, spec.num_kv_layers),
        conv_state=[conv[i] for i in range(n)],
        recurrent_state=[recurrent[i] for i in range(n)],
        kv_dtype=spec.kv_dtype,
        key_scale=zeros(scale_shape, torch.float16, spec.num_kv_layers) if int8 else None,
        value_scale=zeros(scale_shape, torch.float16, spec.num_kv_layers) if int8 else None,
        state_stacks=(conv, recurrent),
    )


def resolve_num_pages(cache_config: CacheConfig, max_context: int, spec: KVSpec) -> int:
    """The KV pool's page count for this config (fixed at startup). `--kv-capacity auto` here is the CPU's
    default budget (`CPU_AUTO_KV_BYTES`); on CUDA the engine measures it instead (engine/runner/sizing.py)."""
    auto_pages = None
    if cache_config.kv_capacity == "auto":
        auto_pages = CPU_AUTO_KV_BYTES // spec.page_bytes(cache_config.page_size)
    return cache_config.num_pages(max_context, auto_pages=auto_pages)
