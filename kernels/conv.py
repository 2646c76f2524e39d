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
  (what the model calls); reads and writes the pool in place;
* ``causal_conv1d_decode_ref``: the decode case of the varlen form (one token per sequence, states in
  slots, slot -1 = a padding row), which the Triton launcher ``causal_conv1d_decode`` implements.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels._dispatch import HAS_TRITON, use_triton

if HAS_TRITON:
    import triton
    import triton.language as tl


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


def causal_conv1d_decode_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_states: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    activation: str | None = "silu",
) -> torch.Tensor:
    """One decode token for each of B sequences whose conv states live in a slot pool.

    x: [B, C], weight: [C, K], conv_states: [num_slots, C, K - 1] (updated in place for every slot
    used), state_slots: [B] (-1 = padding row: output zeros, no state touched), has_initial_state: [B]
    bool (False = start from zeros) -> out [B, C] in x.dtype.
    """
    out = torch.zeros_like(x)
    rows = (state_slots >= 0).nonzero().flatten()
    if rows.numel() == 0:
        return out
    slots = state_slots[rows].long()
    keep = has_initial_state[rows].bool()[:, None, None]
    initial = torch.where(keep, conv_states[slots], torch.zeros_like(conv_states[slots]))
    out[rows], new_state = causal_conv1d_update_ref(x[rows], initial, weight, activation)
    conv_states[slots] = new_state.to(conv_states.dtype)
    return out


if HAS_TRITON:

    @triton.jit
    def _causal_conv1d_decode_kernel(
        x_ptr,
        w_ptr,
        states_ptr,
        slots_ptr,
        keep_ptr,
        out_ptr,
        channels,
        x_stride,
        out_stride,
        KERNEL: tl.constexpr,
        SILU: tl.constexpr,
        BLOCK_C: tl.constexpr,
    ):
        # grid (B, cdiv(C, BLOCK_C)): one program convolves BLOCK_C channels of one sequence's token and
        # shifts those channels' conv state by one (each thread owns its channels: no races).
        row = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        mask = offs < channels
        slot = tl.load(slots_ptr + row).to(tl.int64)
        out_ptrs = out_ptr + row * out_stride + offs
        if slot < 0:
            tl.store(out_ptrs, tl.zeros([BLOCK_C], dtype=out_ptr.dtype.element_ty), mask=mask)
            return
        keep = tl.load(keep_ptr + row) != 0
        x = tl.load(x_ptr + row * x_stride + offs, mask=mask, other=0.0)
        acc = x.to(tl.float32) * tl.load(w_ptr + offs * KERNEL + (KERNEL - 1), mask=mask, other=0.0).to(
            tl.float32
        )
        state_ptrs = states_ptr + slot * channels * (KERNEL - 1) + offs * (KERNEL - 1)
        for j in tl.static_range(KERNEL - 1):
            s = tl.load(state_ptrs + j, mask=mask & keep, other=0.0).to(x_ptr.dtype.element_ty)
            acc += s.to(tl.float32) * tl.load(w_ptr + offs * KERNEL + j, mask=mask, other=0.0).to(tl.float32)
            if j > 0:
                tl.store(state_ptrs + (j - 1), s.to(states_ptr.dtype.element_ty), mask=mask)
        tl.store(state_ptrs + (KERNEL - 2), x.to(states_ptr.dtype.element_ty), mask=mask)
        if SILU:
            acc = acc * tl.sigmoid(acc)
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def causal_conv1d_decode(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_states: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    activation: str | None = "silu",
) -> torch.Tensor:
    """Launcher for ``causal_conv1d_decode_ref`` (same contract; no host sync, CUDA-graph safe)."""
    if not use_triton(x, weight, conv_states, state_slots, has_initial_state):
        return causal_conv1d_decode_ref(x, weight, conv_states, state_slots, has_initial_state, activation)
    batch, channels = x.shape
    kernel = weight.shape[-1]
    assert activation in (None, "silu"), f"activation={activation!r}: only 'silu' or None are supported"
    assert kernel >= 2 and weight.shape == (channels, kernel) and weight.is_contiguous(), tuple(weight.shape)
    assert conv_states.shape[1:] == (channels, kernel - 1) and conv_states.is_contiguous(), (
        f"conv_states {tuple(conv_states.shape)} for C={channels}, K={kernel}"
    )
    assert x.stride(-1) == 1, "x must have unit stride along channels"
    assert state_slots.shape == (batch,) and has_initial_state.shape == (batch,)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    block_c = 256
    if batch:
        _causal_conv1d_decode_kernel[(batch, triton.cdiv(channels, block_c))](
            x, weight, conv_states, state_slots, has_initial_state, out, channels, x.stride(0), out.stride(0),
            KERNEL=kernel, SILU=activation == "silu", BLOCK_C=block_c,
        )  # fmt: skip
    return out
