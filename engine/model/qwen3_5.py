"""The Qwen3.5-family causal LM (dense and MoE): embedding, hybrid decoder stack, final norm, lm_head.

``forward(batch, cache)`` runs one flat varlen batch and returns the final (post-norm) hidden states
``[T, hidden]``; ``compute_logits(hidden, indices)`` projects only the rows that need logits.
Module names equal the checkpoint tensor names (``model.layers.N.linear_attn.in_proj_qkv.weight``,
``lm_head.weight``, ``mtp.fc.weight``), so loading is a name-for-name assignment (``weights.py``).
Once loaded, ``fuse_projections()`` concatenates each layer's input projections into one GEMM
(``qkv_proj``, ``linear_attn.in_proj``, ``mlp.gate_up_proj``); every path that builds a model to run
calls it (``loader.build_model``, ``engine.testing.synthetic.build_synthetic``), so the fused names, not the
checkpoint's, are what a running model's ``state_dict`` holds for those projections.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from engine.model.attention import GatedAttention
from engine.model.config import ModelConfig
from engine.model.decoder import DecoderLayer
from engine.model.forward import ForwardBatch, ModelCache
from engine.model.gdn import GatedDeltaNet
from engine.model.linear import Linear
from engine.model.mlp import MLP
from engine.model.mtp import MultiTokenPredictor
from engine.model.norm import RMSNorm
from kernels.linear import linear
from kernels.rope import mrope_axis_map_ref, rope_inv_freq_ref


class Qwen3_5TextModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        layers = []
        for layer_id, layer_type in enumerate(config.layer_types):
            ids = config.linear_layer_ids if layer_type == "linear_attention" else config.attention_layer_ids
            layers.append(DecoderLayer(config, layer_type, ids.index(layer_id)))
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self._rope_consts: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [T, rotary_dim] for [T] text or [3, T] multimodal positions.

        The math of ``kernels.rope.rope_cos_sin_ref``, with its constant tables (inverse frequencies,
        mrope axis map) built once per device: no host-to-device copy per step, so a decode step can
        be captured in a CUDA graph.
        """
        c = self.config
        consts = self._rope_consts.get(positions.device)
        if consts is None:
            inv_freq = rope_inv_freq_ref(c.rotary_dim, c.rope_theta, positions.device)
            axis = mrope_axis_map_ref(inv_freq.numel(), c.mrope_section).to(positions.device)
            consts = self._rope_consts[positions.device] = (inv_freq, axis)
        inv_freq, axis = consts
        pos3 = positions.unsqueeze(0).expand(3, -1) if positions.dim() == 1 else positions
        freqs = pos3.to(torch.float32).unsqueeze(-1) * inv_freq  # [3, T, rotary_dim / 2]
        chosen = freqs.gather(0, axis.view(1, 1, -1).expand(1, freqs.shape[1], -1)).squeeze(0)
        table = torch.cat([chosen, chosen], dim=-1)
        return table.cos(), table.sin()

    def forward(
        self,
        batch: ForwardBatch,
        cache: ModelCache,
        capture: tuple[int, ...] = (),
        captured: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Final hidden states; with `capture` (layer ids) also appends each listed layer's output (its residual
        stream, before any norm) to `captured`, in the order listed (the DFlash drafter's target features)."""
        residual = self.embed_tokens(batch.input_ids)
        if batch.media_embeds is not None and batch.media_mask is not None:  # images / video frames
            mask = batch.media_mask.unsqueeze(-1)
            residual = residual.masked_scatter(mask, batch.media_embeds.to(residual.dtype))
        rope = self.rope(batch.positions)
        if not self.layers:
            return self.norm(residual)
        # NOTE: nn.ModuleList is untyped; __init__ fills it with DecoderLayers only.
        layers = cast(list[DecoderLayer], list(self.layers))
        next_norms = [layer.input_layernorm for layer in layers[1:]]
        next_norms.append(self.norm)
        outputs: dict[int, torch.Tensor] = {}
        normed = layers[0].input_layernorm(residual)
        for i, (layer, next_norm) in enumerate(zip(layers, next_norms, strict=True)):
            normed, residual = layer.forward_fused(normed, residual, rope, batch, cache, next_norm)
            if i in capture:
                outputs[i] = residual
        if captured is not None:
            captured.extend(outputs[i] for i in capture)
        return normed


class Qwen3_5ForCausalLM(nn.Module):
    """One class for both architectures; the config decides dense MLP vs MoE."""

    def __init__(self, config: ModelConfig, with_mtp: bool = False) -> None:
        super().__init__()
        self.config = config
        self.model = Qwen3_5TextModel(config)
        # tied: no head of its own, the logits read the embedding's weight (``compute_logits``)
        self.lm_head = None if config.tie_word_embeddings else Linear(config.hidden_size, config.vocab_size)
        self.mtp = MultiTokenPredictor(config) if with_mtp else None
        # The DFlash companion (engine/spec/dflash.py), attached by the loader with `--spec dflash`; else None.
        self.dflash: nn.Module | None = None

    @property
    def has_mtp(self) -> bool:
        return self.mtp is not None

    def fuse_projections(self) -> int:
        """Fuse every layer's input projections (attention q/k/v, GDN in_proj_*, dense MLP and MoE shared
        expert gate/up; the MTP head's layers too) into one ``Linear`` each, module by module: call once,
        after the weights are loaded. Returns how many modules it fused (0 when already fused: a no-op).

        Memory: each module's concatenation is allocated before its originals are dropped, so the peak is
        the model plus one module's projections; on CUDA the originals' cached blocks go back to the
        driver after every module (``empty_cache``), or they would stay reserved (the fused blocks are
        larger than any of them, so the allocator could not reuse them) and shrink the KV pool that
        ``--kv-capacity auto`` sizes from the free device memory. Whoever holds other references to the
        original weights (a loader's name -> tensor dict) must drop them first for the memory to return.
        """
        modules = [m for m in self.modules() if isinstance(m, GatedAttention | GatedDeltaNet | MLP)]
        fused = 0
        for module in modules:
            if not module.fuse_projections():
                continue
            fused += 1
            if any(p.is_cuda for p in module.parameters()):
                torch.cuda.empty_cache()
        return fused

    def forward(self, batch: ForwardBatch, cache: ModelCache) -> torch.Tensor:
        """Final hidden states [T, hidden] for every token of the batch (KV and GDN state written)."""
        return self.model(batch, cache)

    def forward_features(
        self, batch: ForwardBatch, cache: ModelCache, layers: tuple[int, ...]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward`` plus the outputs of decoder `layers`, concatenated: (hidden [T, H], features
        [T, len(layers) * H]) (the DFlash drafter's conditioning, engine/spec/dflash_draft.py)."""
        captured: list[torch.Tensor] = []
        hidden = self.model(batch, cache, layers, captured)
        return hidden, torch.cat(captured, dim=-1)

    def compute_logits(self, hidden: torch.Tensor, indices: torch.Tensor | None = None) -> torch.Tensor:
        """fp32 logits [N, vocab] for ``hidden[indices]`` (all rows when indices is None)."""
        rows = hidden if indices is None else hidden[indices]
        if self.lm_head is None:  # tied embeddings: the dense embedding table is the head's weight
            return linear(rows, self.model.embed_tokens.weight).float()
        return self.lm_head(rows).float()

    def forward_mtp(
        self, batch: ForwardBatch, target_hidden: torch.Tensor, cache: ModelCache, step: int = 0
    ) -> torch.Tensor:
        """MTP hidden states [T, hidden]: ``batch.input_ids`` are the next tokens, ``batch.positions``
        the positions of ``target_hidden``'s rows. Feed the result to ``compute_logits``."""
        if self.mtp is None:
            raise RuntimeError("forward_mtp: the model was loaded without MTP weights (with_mtp=False)")
        embeds = self.model.embed_tokens(batch.input_ids)
        return self.mtp(embeds, target_hidden, self.model.rope(batch.positions), batch, cache, step)


class Qwen3_5MoeForCausalLM(Qwen3_5ForCausalLM):
    """The MoE architecture string; identical code, the config carries the experts."""


ARCHITECTURES: dict[str, type[Qwen3_5ForCausalLM]] = {
    "Qwen3_5ForCausalLM": Qwen3_5ForCausalLM,
    "Qwen3_5MoeForCausalLM": Qwen3_5MoeForCausalLM,
}


def model_class(config: ModelConfig) -> type[Qwen3_5ForCausalLM]:
    return ARCHITECTURES[config.architecture]
