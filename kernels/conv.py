"""Causal depthwise conv1d references (the short convolution in front of Gated DeltaNet).

Each channel ``c`` has its own ``K``-tap filter ``w[c, :]``; the output at token ``t`` is
``act(sum_j w[c, j] * x[t - (K - 1) + j, c])``, where tokens before the start of the chunk come
from the *conv state*: the last ``K - 1`` raw (pre-activation) inputs of the sequence so far, oldest
first, zeros for a fresh sequence. After a chunk the new state is the last ``K - 1`` inputs of
``concat(state, chunk)``, so a sequence split into chunks gives exactly the unsplit result.

Three entry points share that rule:

* ``causal_conv1d_ref``: one sequence chunk from an initial state, returning the new state;
* ``causal_conv1d_update_ref``: one token for each of B sequences (decode);
* ``causal_conv1d_varlen_ref``: a flat varlen batch whose states live in slots of a state pool
  (what the model calls); reads and writes the pool in place.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _activate(x: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation is None:
        return x
    if activation == "silu":
        return F.silu(x)
    raise ValueError(f"activation={activation!r}: only 'silu' or None are supported")


def causal_conv1d_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    activation: str | None = "silu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence chunk.

    x: [T, C], weight: [C, K], initial_state: [C, K - 1] or None (zeros)
    -> (out [T, C] in x.dtype, new_state [C, K - 1] in x.dtype).
    """
    num_tokens, channels = x.shape
    kernel = weight.shape[-1]
    if initial_state is None:
        initial_state = x.new_zeros(channels, kernel - 1)
    history = torch.cat([initial_state.to(x.dtype).t(), x], dim=0).float()  # [K - 1 + T, C]
    windows = history.unfold(0, kernel, 1)  # [T, C, K]
    out = (windows * weight.float().unsqueeze(0)).sum(dim=-1)
    new_state = history[history.shape[0] - (kernel - 1) :].t().to(x.dtype)
    return _activate(out, activation).to(x.dtype), new_state.contiguous()


def causal_conv1d_update_ref(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    activation: str | None = "silu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode token for each of B sequences.

    x: [B, C], conv_state: [B, C, K - 1], weight: [C, K] -> (out [B, C], new_state [B, C, K - 1]).
    """
    window = torch.cat([conv_state.to(x.dtype), x.unsqueeze(-1)], dim=-1).float()  # [B, C, K]
    out = (window * weight.float().unsqueeze(0)).sum(dim=-1)
    return _activate(out, activation).to(x.dtype), window[..., 1:].to(x.dtype).contiguous()


def causal_conv1d_varlen_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_states: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    activation: str | None = "silu",
) -> torch.Tensor:
    """A flat batch of B sequence chunks whose conv states live in a slot pool.

    x: [T, C] (sequence b owns rows cu_seqlens[b]:cu_seqlens[b + 1]), weight: [C, K],
    conv_states: [num_slots, C, K - 1] (read, then overwritten in place for every slot used),
    cu_seqlens: [B + 1], state_slots: [B], has_initial_state: [B] bool (False = start from zeros)
    -> out [T, C].
    """
    bounds = cu_seqlens.tolist()
    slots = state_slots.tolist()
    cont = has_initial_state.tolist()
    out = torch.empty_like(x)
    for b, slot in enumerate(slots):
        start, end = bounds[b], bounds[b + 1]
        if end == start:
            continue
        initial = conv_states[slot] if cont[b] else None
        out[start:end], new_state = causal_conv1d_ref(x[start:end], weight, initial, activation)
        conv_states[slot] = new_state.to(conv_states.dtype)
    return out
