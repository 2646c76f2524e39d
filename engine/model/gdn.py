"""Gated DeltaNet token mixer (Qwen3.5 ``linear_attn``).

in_proj_qkv -> causal depthwise conv1d (SiLU) over the concatenated q|k|v channels -> split heads;
``beta = sigmoid(b)``, ``g = -exp(A_log) * softplus(a + dt_bias)`` (fp32); the gated delta rule from
the sequence's saved state (chunked for multi-token chunks, recurrent for single tokens); per-head
gated RMSNorm with ``z`` as the gate; out_proj. Conv and recurrent states live in the slot pool of
``ModelCache`` at index ``state_index``; this layer reads and writes only the slots the batch names.

Paths (chosen from shapes only; a speculative verify batch is flagged by ``batch.verify_width``):
- verify (every sequence feeds ``verify_width`` tokens): position by position through the decode ops,
  each writing its state out of place into the snapshot slot of that position, the last one into the
  working slot (``_verify``; engine/spec).
- decode (``T == B``, one token per sequence): ``causal_conv1d_decode`` then
  ``gated_delta_rule_decode``, which computes the gates itself from ``a``/``b`` (no host sync; a
  state slot of -1 marks a padding row that touches no state: CUDA-graph padding).
- prefill / mixed: on CUDA one ``causal_conv1d_varlen_split`` launch convolves every sequence from its
  saved conv state (no history concatenation) and writes q, k and v as separate contiguous tensors
  (no ``.contiguous()`` before the chunked rule); the rule runs as ``chunk_gated_delta_rule`` (fla-core's
  chunked kernel when installed) per multi-token sequence, the single-token rows through the decode
  kernel; elsewhere ``causal_conv1d_varlen_ref`` and ``gated_delta_rule_varlen_ref``.

The input projections are ``Linear`` layers named by ``input_projections`` whose named outputs
(``query``, ``key``, ``value``, ``z``, ``b``, ``a``) the layer reads by name. ``fuse_projections()`` (called
once after loading, see ``Qwen3_5ForCausalLM.fuse_projections``) replaces in_proj_qkv, in_proj_z, in_proj_b and
in_proj_a by one ``in_proj`` (rows qkv | z | b | a): one GEMM whose output is split into views with the fused
row stride. (A quantized artifact stores its own parents, e.g. the 27B ``query_key`` Q4 + ``value_z`` Q5: the
conv input q|k|v then spans two outputs and is concatenated, a copy of the activations.) Every consumer reads them in place, no copy: the
conv kernels take any row stride (qkv), the decode rule any row stride of a and b, the gated norm a
[T, Hv, Dv] gate with any token and head strides (z); the prefill gate math (softplus, sigmoid) reads a
and b into new tensors, as it did before.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.config import ModelConfig
from engine.model.forward import ForwardBatch, ModelCache
from engine.model.fusion import concat_linears
from engine.model.linear import Linear, bound_inputs
from engine.model.norm import GatedRMSNorm
from kernels.conv import causal_conv1d_decode, causal_conv1d_varlen_ref, causal_conv1d_varlen_split
from kernels.gdn import chunk_gated_delta_rule, gated_delta_rule_decode, gated_delta_rule_varlen_ref

# what the layer reads from its input projections: the conv input q|k|v (one view when adjacent), z, b, a
_INPUT_GROUPS = (("query", "key", "value"), ("z",), ("b",), ("a",))


class _Conv1dWeight(nn.Module):
    """Holds ``conv1d.weight`` [conv_dim, 1, K] under the checkpoint's name (HF stores an nn.Conv1d)."""

    def __init__(self, channels: int, kernel: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(channels, 1, kernel), requires_grad=False)


class GatedDeltaNet(nn.Module):
    def __init__(self, config: ModelConfig, state_index: int) -> None:
        super().__init__()
        self.state_index = state_index  # which entry of ModelCache.conv_state / recurrent_state
        self.num_k_heads = config.linear_num_key_heads
        self.num_v_heads = config.linear_num_value_heads
        self.k_dim = config.linear_key_head_dim
        self.v_dim = config.linear_value_head_dim
        self.key_dim, self.value_dim = config.linear_key_dim, config.linear_value_dim
        hidden = config.hidden_size
        qkv = [("query", self.key_dim), ("key", self.key_dim), ("value", self.value_dim)]
        self.in_proj_qkv = Linear(hidden, config.conv_dim, qkv)
        self.in_proj_z = Linear(hidden, self.value_dim, [("z", self.value_dim)])
        self.in_proj_b = Linear(hidden, self.num_v_heads, [("b", self.num_v_heads)])
        self.in_proj_a = Linear(hidden, self.num_v_heads, [("a", self.num_v_heads)])
        self.in_proj: Linear | None = None  # in_proj_qkv | in_proj_z | in_proj_b | in_proj_a once fused
        # the attributes holding the current input projections (the loader of a quantized artifact sets its own)
        self.input_projections: tuple[str, ...] = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
        self.conv_dim = config.conv_dim
        self.conv1d = _Conv1dWeight(config.conv_dim, config.linear_conv_kernel_dim)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads), requires_grad=False)
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads), requires_grad=False)
        self.norm = GatedRMSNorm(self.v_dim, config.rms_norm_eps)
        self.out_proj = Linear(self.value_dim, hidden)

    def _heads(self, mixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[T, conv_dim] -> query, key [T, Hk, Dk] and value [T, Hv, Dv]: views (C methods only: no Python-level
        torch wrappers on the decode path)."""
        tokens = mixed.shape[0]
        query, key, value = mixed.split_with_sizes([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        return (
            query.view(tokens, self.num_k_heads, self.k_dim),
            key.view(tokens, self.num_k_heads, self.k_dim),
            value.view(tokens, self.num_v_heads, self.v_dim),
        )

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: ModelCache) -> torch.Tensor:
        num_tokens = x.shape[0]
        # (qkv [T, conv_dim], z [T, value_dim], b [T, Hv], a [T, Hv]); once fused, views of one GEMM's output
        # (unit stride along the channels, the fused row stride)
        qkv, z, b, a = bound_inputs(self, _INPUT_GROUPS).run(x)
        conv_state = cache.conv_state[self.state_index]
        states = cache.recurrent_state[self.state_index]
        weight = self.conv1d.weight.squeeze(1)
        if batch.verify_width > 1:
            core = self._verify(qkv, a, b, weight, conv_state, states, batch)
        elif num_tokens == batch.num_sequences:
            mixed = causal_conv1d_decode(qkv, weight, conv_state, batch.state_slots, batch.has_initial_state)
            query, key, value = self._heads(mixed)
            core = gated_delta_rule_decode(
                query, key, value, a, b, self.A_log, self.dt_bias, states,
                batch.state_slots, batch.has_initial_state,
            )  # fmt: skip
        elif x.is_cuda:
            core = self._prefill_cuda(qkv, a, b, weight, conv_state, states, batch)
        else:
            mixed = causal_conv1d_varlen_ref(
                qkv, weight, conv_state, batch.query_start_loc, batch.state_slots, batch.has_initial_state,
                activation="silu",
            )  # fmt: skip
            query, key, value = self._heads(mixed)
            beta = torch.sigmoid(b)
            g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
            core = gated_delta_rule_varlen_ref(
                query, key, value, g, beta, states,
                batch.query_start_loc, batch.state_slots, batch.has_initial_state,
            )  # fmt: skip
        gate = z.view(num_tokens, self.num_v_heads, self.v_dim)
        return self.out_proj(self.norm(core, gate).reshape(num_tokens, self.value_dim))

    def _verify(
        self,
        qkv: torch.Tensor,  # [B * W, conv_dim], sequence-major
        a: torch.Tensor,
        b: torch.Tensor,
        weight: torch.Tensor,
        conv_state: torch.Tensor,
        states: torch.Tensor,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        """A speculative verify batch: position j of every sequence through the decode ops, in order, each
        writing its state out of place: position j reads the state after position j - 1 (the working slot
        for j = 0, else ``snapshot_slots[:, j - 1]``) and writes the state after position j to
        ``snapshot_slots[:, j]`` (j < W - 1) or to the working slot (j = W - 1). So every snapshot holds its
        position's state with no copy, and the working slot is read first and written last (the rollback
        copies a snapshot over it). A padding row has slot -1 everywhere: it reads and writes no state."""
        width, slots, snaps = batch.verify_width, batch.state_slots, batch.snapshot_slots
        assert snaps is not None and qkv.shape[0] == width * batch.num_sequences
        core = qkv.new_empty(qkv.shape[0], self.num_v_heads, self.v_dim)
        cont = batch.has_initial_state
        for j in range(width):
            src = slots if j == 0 else snaps[:, j - 1]
            dst = snaps[:, j] if j < width - 1 else slots
            mixed = causal_conv1d_decode(qkv[j::width], weight, conv_state, src, cont, out_slots=dst)
            query, key, value = self._heads(mixed)
            core[j::width] = gated_delta_rule_decode(
                query, key, value, a[j::width], b[j::width], self.A_log, self.dt_bias, states, src, cont,
                out_slots=dst,
            )  # fmt: skip
            if j == 0:
                cont = torch.ones_like(cont)
        return core

    def fuse_projections(self) -> bool:
        """Replace in_proj_qkv, in_proj_z, in_proj_b, in_proj_a by one ``in_proj`` (their weights
        concatenated, the originals dropped). Returns False (and changes nothing) when already fused."""
        if self.input_projections != ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"):
            return False
        self.in_proj = concat_linears(self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a)
        del self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a
        self.input_projections = ("in_proj",)
        return True

    def _prefill_cuda(
        self,
        qkv: torch.Tensor,  # [T, conv_dim]
        a: torch.Tensor,  # [T, Hv]
        b: torch.Tensor,
        weight: torch.Tensor,  # [conv_dim, K]
        conv_state: torch.Tensor,  # [slots, conv_dim, K - 1]
        states: torch.Tensor,  # [slots, Hv, Dk, Dv] fp32
        batch: ForwardBatch,
    ) -> torch.Tensor:
        """One varlen conv launch for the batch, then the chunked rule per sequence (the sequence bounds come
        from the batch's host mirrors: no sync)."""
        num_tokens = qkv.shape[0]
        q_all, k_all, v_all = causal_conv1d_varlen_split(
            qkv, weight, conv_state, batch.query_start_loc, batch.state_slots, batch.has_initial_state,
            (self.key_dim, self.key_dim, self.value_dim), activation="silu",
        )  # fmt: skip
        query_all = q_all.view(num_tokens, self.num_k_heads, self.k_dim)  # contiguous, as fla wants
        key_all = k_all.view(num_tokens, self.num_k_heads, self.k_dim)
        value_all = v_all.view(num_tokens, self.num_v_heads, self.v_dim)
        bounds, slots, cont = batch.host_layout()
        g_all = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        beta_all = torch.sigmoid(b)
        core: torch.Tensor | None = None
        for i, slot in enumerate(slots):
            start, end = bounds[i], bounds[i + 1]
            if end == start:
                continue
            query, key, value = query_all[start:end], key_all[start:end], value_all[start:end]
            if end - start == 1:
                out = gated_delta_rule_decode(
                    query, key, value, a[start:end], b[start:end], self.A_log, self.dt_bias, states,
                    batch.state_slots[i : i + 1], batch.has_initial_state[i : i + 1],
                )  # fmt: skip
            else:
                initial = states[slot : slot + 1] if cont[i] else None
                chunk_out, final = chunk_gated_delta_rule(
                    query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0),
                    g_all[start:end].unsqueeze(0), beta_all[start:end].unsqueeze(0), initial,
                )  # fmt: skip
                states[slot] = final[0]
                out = chunk_out[0]
            if start == 0 and end == num_tokens:  # one sequence covers the batch: its output is the core
                return out
            if core is None:
                core = qkv.new_empty(num_tokens, self.num_v_heads, self.v_dim)
            core[start:end] = out
        return core if core is not None else qkv.new_empty(num_tokens, self.num_v_heads, self.v_dim)
