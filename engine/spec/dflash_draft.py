"""The DFlash drafter (`--spec dflash`): K proposals per lane in one block forward of the DFlash companion.

Owns: the companion's context KV (`DFlashKV`: per draft layer K and V of every computed target position, in
pages parallel to the target's: the same page ids, tensors of the companion's own shape, so a prefix hit that
shares pages shares them, and a copied page is copied here too), its writes, the block forward per step, and
the load of the companion from an artifact (`load_dflash`). Must not touch: requests, the scheduler, page
ownership, the target's cache.

Per step (after verification and GDN rollback; the rows are `engine.spec.mtp.DraftRow`s):

1. catch-up: every row's kept positions [s, s + v) get their context KV from the target features the step's
   forward captured (engine/model/qwen3_5.py `forward_features`; rejected drafts' features are dropped);
2. a drafting row (it sampled a bonus token b and may draft) with computed positions [0, e) runs the block
   [b, mask x K] at positions e .. e + K over its context KV [0, e) (a sliding layer reads only its window)
   and the target's output head reads block rows 1 .. K: the K proposals, drawn as the MTP drafter draws
   (`draft_tokens`: greedy argmax or a sample from the processed q, which verification needs).

The context KV of position p depends on the tokens up to p only (the target's features at p), so it needs no
copy-on-write at a prefix boundary and no per-slot state: `copy_slot` does nothing. Blocks never write KV,
so drafting needs no page beyond those the target's verify row maps. Unlike the upstream (a 4,096-slot
cyclic cache for the sliding layers), every layer keeps all positions in pages: simpler, at 6 x 8 x 128 x 2
values per token (24 KiB in bf16, beside the 35B-A3B's 20 KiB of target KV). Host parking never sees these
tensors, which is why `--spec dflash` refuses `--host-kv-cache-mib` (engine/config.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from engine.model.forward import ModelCache
from engine.model.qwen3_5 import Qwen3_5ForCausalLM
from engine.spec.dflash import DFlashConfig, DFlashDraftModel, build_dflash, check_target
from engine.spec.mtp import DraftRow, Proposal
from engine.spec.verify import GeneratorFor, draft_tokens

CONFIG_RESOURCE = "dflash/config.json"  # the companion's HF config inside a target artifact
TENSOR_PREFIX = "dflash."  # its tensors: "dflash." + the checkpoint name


class _Source(Protocol):
    def resource_names(self) -> list[str]: ...

    def resource(self, name: str) -> bytes: ...

    def tensor_names(self) -> list[str]: ...

    def tensor(self, name: str) -> torch.Tensor: ...


def has_dflash(source: _Source) -> bool:
    return CONFIG_RESOURCE in source.resource_names()


def load_dflash(
    source: _Source, device: torch.device | str = "cpu", dtype: torch.dtype | None = None
) -> DFlashDraftModel:
    """The companion an artifact carries (`dflash/config.json` + `dflash.*` tensors); ValueError when it has
    none (only the artifacts built for DFlash do) or its tensors do not match the config."""
    if not has_dflash(source):
        raise ValueError(
            f"--spec dflash: this artifact carries no DFlash companion ({CONFIG_RESOURCE} and {TENSOR_PREFIX}* "
            "tensors); DFlash drafts for Qwen3.6-35B-A3B artifacts built with one"
        )
    config = DFlashConfig.from_hf(json.loads(source.resource(CONFIG_RESOURCE)))
    names = [n for n in source.tensor_names() if n.startswith(TENSOR_PREFIX)]
    tensors = {n[len(TENSOR_PREFIX) :]: source.tensor(n) for n in names}
    return build_dflash(config, tensors, device, dtype)


def attach_dflash(model: Qwen3_5ForCausalLM, draft: DFlashDraftModel) -> Qwen3_5ForCausalLM:
    """Check that `model` can host `draft` (`check_target`: ValueError otherwise) and attach it."""
    c = model.config
    check_target(draft.config, c.hidden_size, c.num_hidden_layers, c.is_moe, c.vocab_size)
    model.dflash = draft
    return model


def dflash_of(model: Qwen3_5ForCausalLM) -> DFlashDraftModel:
    draft = model.dflash
    if not isinstance(draft, DFlashDraftModel):
        raise ValueError(
            "--spec dflash: the model was loaded without its DFlash companion (load with_dflash)"
        )
    return draft


class DFlashKV:
    """Per draft layer K and V, [num_pages * page_size + 1, Hkv, D] each (flat slots: page * page_size + row; the
    last slot, `sink`, belongs to no page: the static round's padding positions store there, nothing reads it)."""

    def __init__(self, config: DFlashConfig, num_pages: int, page_size: int, dtype: torch.dtype, device: Any):
        shape = (num_pages * page_size + 1, *self.token_shape(config))
        self.page_size, self.num_pages = page_size, num_pages
        self.sink = num_pages * page_size
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.values = [
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)
        ]

    @staticmethod
    def token_shape(config: DFlashConfig) -> tuple[int, int]:
        return config.num_key_value_heads, config.head_dim

    @classmethod
    def bytes_per_token(cls, config: DFlashConfig, dtype: torch.dtype) -> int:
        """Device bytes a pool token costs here (K and V of every draft layer): the KV pool's sizing counts them
        (``KVSpec.companion_bytes_per_token``)."""
        heads, dim = cls.token_shape(config)
        return 2 * config.num_hidden_layers * heads * dim * torch.empty((), dtype=dtype).element_size()

    def copy_page(self, src: int, dst: int) -> None:
        p = self.page_size
        for t in (*self.keys, *self.values):
            t[dst * p : (dst + 1) * p].copy_(t[src * p : (src + 1) * p])


def paged_slots(page_table: torch.Tensor, positions: torch.Tensor, page_size: int) -> torch.Tensor:
    """Flat KV slots of `positions` [B, C] through `page_table` [B, max_pages]."""
    return page_table.gather(1, positions // page_size).long() * page_size + positions % page_size


class DFlashDrafter:
    """Use: `advance(rows, features)` once per step after verification; `copy_page` beside page copies."""

    def __init__(self, model: Qwen3_5ForCausalLM, cache: ModelCache, generator: GeneratorFor) -> None:
        self.model, self.generator = model, generator
        self.draft = dflash_of(model)
        self.config = self.draft.config
        self.feature_layers = self.config.target_layer_ids
        param = next(self.draft.parameters())
        self.device = param.device
        self.kv = DFlashKV(self.config, cache.num_pages, cache.page_size, param.dtype, param.device)
        self.page_size = cache.page_size

    def copy_slot(self, src: int, dst: int) -> None:
        """Nothing per slot: the context KV is per position, in pages (see the module docstring)."""

    def copy_page(self, src: int, dst: int) -> None:
        self.kv.copy_page(src, dst)

    def advance(self, rows: Sequence[DraftRow], features: torch.Tensor) -> list[Proposal]:
        """Store every row's kept positions' context KV, then propose each drafting row's block.
        `features`: the step's target features [T, n * H], rows as `DraftRow.hidden_rows` index them."""
        self._catch_up(rows, features)
        drafting = [i for i, r in enumerate(rows) if r.num_drafts > 0 and r.bonus is not None]
        out = [Proposal((), None)] * len(rows)
        if not drafting:
            return out
        k = min(max(rows[i].num_drafts for i in drafting), self.config.max_draft_tokens)
        for i, proposal in zip(drafting, self._propose([rows[i] for i in drafting], k), strict=True):
            out[i] = proposal
        return out

    def _catch_up(self, rows: Sequence[DraftRow], features: torch.Tensor) -> None:
        index: list[int] = []
        slots: list[int] = []
        positions: list[int] = []
        p = self.page_size
        for r in rows:
            for j in range(len(r.tokens)):
                pos = r.start_pos + j
                index.append(r.hidden_rows[j])
                positions.append(pos)
                slots.append(r.page_ids[pos // p] * p + pos % p)
        if not index:
            return
        dev = self.device
        feats = features[torch.tensor(index, device=features.device)].to(next(self.draft.parameters()).dtype)
        kv = self.draft.context_kv(feats, torch.tensor(positions, device=dev))
        where = torch.tensor(slots, device=dev)
        for layer, (key, value) in enumerate(kv):
            self.kv.keys[layer].index_copy_(0, where, key)
            self.kv.values[layer].index_copy_(0, where, value)

    def _propose(self, rows: Sequence[DraftRow], k: int) -> list[Proposal]:
        c, dev, p = self.config, self.device, self.page_size
        s = k + 1
        ends = [r.start_pos + len(r.tokens) for r in rows]  # e: the anchor's position
        max_pages = max(len(r.page_ids) for r in rows)
        table = torch.tensor(
            [list(r.page_ids) + [0] * (max_pages - len(r.page_ids)) for r in rows],
            dtype=torch.int64,
            device=dev,
        )
        end = torch.tensor(ends, device=dev)
        block_ids = torch.tensor([[r.bonus] + [c.mask_token_id] * k for r in rows], device=dev)
        positions = end[:, None] + torch.arange(s, device=dev)[None, :]
        contexts: dict[int | None, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        for window in {c.window(i) for i in range(c.num_hidden_layers)}:
            # keys a block can see: [e - window + 1, e) for a sliding layer (the anchor's window), all of [0, e)
            low = [0 if window is None else max(0, e - window + 1) for e in ends]
            width = max(max(e - lo for e, lo in zip(ends, low, strict=True)), 1)
            pos = torch.tensor(low, device=dev)[:, None] + torch.arange(width, device=dev)[None, :]
            valid = pos < end[:, None]
            pos = torch.minimum(pos, (end[:, None] - 1).clamp(min=0))
            contexts[window] = (paged_slots(table, pos, p), pos, valid)

        def context(layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
            slots, pos, valid = contexts[c.window(layer)]
            return self.kv.keys[layer][slots], self.kv.values[layer][slots], pos, valid

        embeds = self.model.model.embed_tokens(block_ids)
        hidden = self.draft.forward_block(embeds, positions, context)  # [B, S, H]
        return self.proposals(rows, hidden[:, 1:])

    def proposals(self, rows: Sequence[DraftRow], hidden: torch.Tensor) -> list[Proposal]:
        """Each row's proposals from its block's final hidden states at the K mask rows, `hidden` [B, K, H]: the
        target's head, then `draft_tokens` (greedy argmax, or a draw from the processed q, which verification
        needs); a row proposes min(num_drafts, K)."""
        b, k = hidden.shape[0], hidden.shape[1]
        logits = self.model.compute_logits(hidden.reshape(b * k, -1))
        params = [r.params for r in rows for _ in range(k)]
        ids = [r.request_id for r in rows for _ in range(k)]
        history = [r.history for r in rows for _ in range(k)]
        tokens, q = draft_tokens(logits, params, ids, self.generator, history)
        out = []
        for n, r in enumerate(rows):
            want = min(r.num_drafts, k)
            probs = None if q is None or r.params.temperature == 0.0 else q[n * k : n * k + want]
            out.append(Proposal(tuple(tokens[n * k : n * k + want]), probs))
        return out
