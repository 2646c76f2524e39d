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
  slots, slot -1 = a padding row; the new state written in place or, with ``out_slots``, to other slots: a
  speculative verify's per-position snapshots), which the Triton launcher ``causal_conv1d_decode`` implements.

The Triton launcher ``causal_conv1d_varlen`` implements the varlen form for prefill (no history
concatenation, no host sync), and ``causal_conv1d_varlen_split`` the same with its output written as
separate contiguous channel groups (q | k | v for the GDN layer: no ``.contiguous()`` after it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels._dispatch import HAS_TRITON, use_triton
from kernels.pdl import pdl_args

if HAS_TRITON:
    import triton
    import triton.language as tl

    from kernels.pdl import pdl_launch_dependents, pdl_wait


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


def causal_conv1d_varlen_split_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_states: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    split_sizes: tuple[int, ...],
    activation: str | None = "silu",
) -> tuple[torch.Tensor, ...]:
    """``causal_conv1d_varlen_ref`` with its output split along channels into contiguous tensors.

    split_sizes: channel counts summing to C -> one contiguous [T, split_sizes[i]] tensor each.
    """
    out = causal_conv1d_varlen_ref(
        x, weight, conv_states, cu_seqlens, state_slots, has_initial_state, activation
    )
    return tuple(part.contiguous() for part in out.split(list(split_sizes), dim=-1))


def causal_conv1d_decode_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_states: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    activation: str | None = "silu",
    out_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """One decode token for each of B sequences whose conv states live in a slot pool.

    x: [B, C], weight: [C, K], conv_states: [num_slots, C, K - 1], state_slots: [B] int, where each row's
    state is read (-1 = padding row: output zeros, no state read or written), has_initial_state: [B] bool
    (False = start from zeros), out_slots: [B] int, where each row's shifted state is written (None:
    ``state_slots``, in place; -1 writes nothing; a slot must not be another row's read slot)
    -> out [B, C] in x.dtype.
    """
    out = torch.zeros_like(x)
    rows = (state_slots >= 0).nonzero().flatten()
    if rows.numel() == 0:
        return out
    slots = state_slots[rows].long()
    keep = has_initial_state[rows].bool()[:, None, None]
    initial = torch.where(keep, conv_states[slots], torch.zeros_like(conv_states[slots]))
    out[rows], new_state = causal_conv1d_update_ref(x[rows], initial, weight, activation)
    dst = slots if out_slots is None else out_slots[rows].long()
    conv_states[dst[dst >= 0]] = new_state[dst >= 0].to(conv_states.dtype)
    return out


if HAS_TRITON:

    @triton.jit
    def _causal_conv1d_decode_kernel(
        x_ptr,
        w_ptr,
        states_ptr,
        slots_ptr,
        out_slots_ptr,
        keep_ptr,
        out_ptr,
        channels,
        slots_stride,
        out_slots_stride,
        x_stride,
        out_stride,
        KERNEL: tl.constexpr,
        SILU: tl.constexpr,
        BLOCK_C: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # grid (B, cdiv(C, BLOCK_C)): one program convolves BLOCK_C channels of one sequence's token and
        # writes those channels' conv state shifted by one from slot ``slots[row]`` to slot ``out_slots[row]``
        # (the same slot in place: entry j - 1 is written after entry j is read; none when negative). Each
        # thread owns its channels: no races.
        pdl_wait(PDL)  # kernels/pdl.py: before any read of a predecessor's output or any write
        pdl_launch_dependents(PDL)
        row = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        mask = offs < channels
        slot = tl.load(slots_ptr + row * slots_stride).to(tl.int64)
        out_ptrs = out_ptr + row * out_stride + offs
        if slot < 0:
            tl.store(out_ptrs, tl.zeros([BLOCK_C], dtype=out_ptr.dtype.element_ty), mask=mask)
            return
        out_slot = tl.load(out_slots_ptr + row * out_slots_stride).to(tl.int64)
        write = mask & (out_slot >= 0)
        keep = tl.load(keep_ptr + row) != 0
        x = tl.load(x_ptr + row * x_stride + offs, mask=mask, other=0.0)
        acc = x.to(tl.float32) * tl.load(w_ptr + offs * KERNEL + (KERNEL - 1), mask=mask, other=0.0).to(
            tl.float32
        )
        state_ptrs = states_ptr + slot * channels * (KERNEL - 1) + offs * (KERNEL - 1)
        out_state_ptrs = states_ptr + out_slot * channels * (KERNEL - 1) + offs * (KERNEL - 1)
        for j in tl.static_range(KERNEL - 1):
            s = tl.load(state_ptrs + j, mask=mask & keep, other=0.0).to(x_ptr.dtype.element_ty)
            acc += s.to(tl.float32) * tl.load(w_ptr + offs * KERNEL + j, mask=mask, other=0.0).to(tl.float32)
            if j > 0:
                tl.store(out_state_ptrs + (j - 1), s.to(states_ptr.dtype.element_ty), mask=write)
        tl.store(out_state_ptrs + (KERNEL - 2), x.to(states_ptr.dtype.element_ty), mask=write)
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
    out_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Launcher for ``causal_conv1d_decode_ref`` (same contract; no host sync, CUDA-graph safe).
    state_slots and out_slots may be any 1-D views (a column of a slot table)."""
    if not use_triton(x, weight, conv_states, state_slots, has_initial_state, out_slots):
        return causal_conv1d_decode_ref(
            x, weight, conv_states, state_slots, has_initial_state, activation, out_slots
        )
    out_slots = state_slots if out_slots is None else out_slots
    batch, channels = x.shape
    kernel = weight.shape[-1]
    assert activation in (None, "silu"), f"activation={activation!r}: only 'silu' or None are supported"
    assert kernel >= 2 and weight.shape == (channels, kernel) and weight.is_contiguous(), tuple(weight.shape)
    assert conv_states.shape[1:] == (channels, kernel - 1) and conv_states.is_contiguous(), (
        f"conv_states {tuple(conv_states.shape)} for C={channels}, K={kernel}"
    )
    assert x.stride(-1) == 1, "x must have unit stride along channels"
    assert (
        state_slots.shape == (batch,) and out_slots.shape == (batch,) and has_initial_state.shape == (batch,)
    )
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    block_c = 256
    if batch:
        _causal_conv1d_decode_kernel[(batch, triton.cdiv(channels, block_c))](
            x, weight, conv_states, state_slots, out_slots, has_initial_state, out, channels,
            state_slots.stride(0), out_slots.stride(0), x.stride(0), out.stride(0),
            KERNEL=kernel, SILU=activation == "silu", BLOCK_C=block_c, **pdl_args(x.device),
        )  # fmt: skip
    return out


if HAS_TRITON:

    @triton.jit
    def _conv_out_offsets(rows, cols, c0, num_tokens, channels, split_1, split_2):
        # Where out[t, c] lives: channel groups [0, split_1), [split_1, split_2), [split_2, C) are each a
        # contiguous [num_tokens, width] block after the previous ones (split_1 = split_2 = C: one plain
        # [T, C]). The launcher makes BLOCK_C divide the split points, so a program stays in one group.
        in_2 = c0 >= split_2
        in_1 = (c0 >= split_1) & (c0 < split_2)
        seg_start = tl.where(in_2, split_2, tl.where(in_1, split_1, 0))
        seg_width = tl.where(in_2, channels, tl.where(in_1, split_2, split_1)) - seg_start
        return (
            seg_start.to(tl.int64) * num_tokens
            + rows.to(tl.int64)[:, None] * seg_width
            + (cols - seg_start)[None, :]
        )

    @triton.jit
    def _causal_conv1d_varlen_kernel(
        x_ptr,
        w_ptr,
        states_ptr,
        cu_seqlens_ptr,
        slots_ptr,
        keep_ptr,
        out_ptr,
        num_seqs,
        num_tokens,
        channels,
        num_channel_blocks,
        x_stride_t,
        x_stride_c,
        split_1,
        split_2,
        KERNEL: tl.constexpr,
        SILU: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_C: tl.constexpr,
        BLOCK_K: tl.constexpr,
        SEARCH_STEPS: tl.constexpr,
    ):
        # 1-D grid over (sequence-aligned token tile, channel block), channel block fastest (neighbouring
        # programs read neighbouring columns of the same rows). Sequence b owns the tile ids
        # [cu[b] // BLOCK_T + b, cu[b + 1] // BLOCK_T + b + 1): at least ceil(len_b / BLOCK_T) tiles, the
        # spare ones exit at once, so the grid (T // BLOCK_T + B tiles) needs no host sync. A program finds
        # its sequence by binary search over those starts and convolves BLOCK_T tokens x BLOCK_C channels
        # whose K taps all lie inside the sequence (x only, any strides). Tile 0 of a sequence also does
        # the first K - 1 tokens, whose taps reach into the conv state (a small [BLOCK_K, BLOCK_C] tile),
        # and writes the new conv state: it is the only program that reads this state (BLOCK_T >= K - 1).
        pid = tl.program_id(0)
        block_c = pid % num_channel_blocks
        tile_id = pid // num_channel_blocks
        lo = tile_id * 0
        hi = lo + num_seqs
        for _ in tl.static_range(SEARCH_STEPS):  # ceil(log2(B)) halvings
            mid = (lo + hi) // 2
            go = tl.load(cu_seqlens_ptr + mid) // BLOCK_T + mid <= tile_id
            lo = tl.where(go, mid, lo)
            hi = tl.where(go, hi, mid)
        seq = lo
        seq_start = tl.load(cu_seqlens_ptr + seq).to(tl.int32)
        seq_end = tl.load(cu_seqlens_ptr + seq + 1).to(tl.int32)
        tile = tile_id - (seq_start // BLOCK_T + seq)
        t0 = seq_start + tile * BLOCK_T
        if t0 >= seq_end:
            return
        c0 = block_c * BLOCK_C
        cols = c0 + tl.arange(0, BLOCK_C)
        col_ok = cols < channels
        x_cols = cols.to(tl.int64) * x_stride_c

        # The body: rows whose K taps are all sequence tokens (row - seq_start >= K - 1).
        rows = t0 + tl.arange(0, BLOCK_T)
        body = (rows < seq_end) & (rows - seq_start >= KERNEL - 1)
        mask = body[:, None] & col_ok[None, :]
        acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
        for j in tl.static_range(KERNEL):
            src = (rows - (KERNEL - 1) + j).to(tl.int64)
            xv = tl.load(x_ptr + src[:, None] * x_stride_t + x_cols[None, :], mask=mask, other=0.0)
            w = tl.load(w_ptr + cols * KERNEL + j, mask=col_ok, other=0.0).to(tl.float32)
            acc += xv.to(tl.float32) * w[None, :]
        if SILU:
            acc = acc * tl.sigmoid(acc)
        out_offs = _conv_out_offsets(rows, cols, c0, num_tokens, channels, split_1, split_2)
        tl.store(out_ptr + out_offs, acc.to(out_ptr.dtype.element_ty), mask=mask)

        if tile == 0:
            keep = tl.load(keep_ptr + seq) != 0
            slot = tl.load(slots_ptr + seq).to(tl.int64)
            state_ptrs = states_ptr + slot * channels * (KERNEL - 1) + cols[None, :] * (KERNEL - 1)
            length = seq_end - seq_start
            r = tl.arange(0, BLOCK_K)
            r_ok = r < KERNEL - 1
            # The head: tokens r < K - 1 of the sequence; tap j reads position p = r - (K - 1) + j of
            # concat(state, tokens): state entry K - 1 + p when p < 0 (zeros without initial state).
            head = r_ok & (r < length)
            head_acc = tl.zeros([BLOCK_K, BLOCK_C], dtype=tl.float32)
            for j in tl.static_range(KERNEL):
                p = r - (KERNEL - 1) + j
                from_x = head & (p >= 0)
                from_state = head & (p < 0) & keep
                hx = tl.load(
                    x_ptr + (seq_start + p).to(tl.int64)[:, None] * x_stride_t + x_cols[None, :],
                    mask=from_x[:, None] & col_ok[None, :],
                    other=0.0,
                )
                hs = tl.load(
                    state_ptrs + (p + KERNEL - 1)[:, None],
                    mask=from_state[:, None] & col_ok[None, :],
                    other=0.0,
                )
                hist = tl.where(from_x[:, None], hx, hs.to(x_ptr.dtype.element_ty)).to(tl.float32)
                hw = tl.load(w_ptr + cols * KERNEL + j, mask=col_ok, other=0.0).to(tl.float32)
                head_acc += hist * hw[None, :]
            if SILU:
                head_acc = head_acc * tl.sigmoid(head_acc)
            head_offs = _conv_out_offsets(seq_start + r, cols, c0, num_tokens, channels, split_1, split_2)
            tl.store(
                out_ptr + head_offs,
                head_acc.to(out_ptr.dtype.element_ty),
                mask=head[:, None] & col_ok[None, :],
            )
            # New state entry i = concat(old state, tokens)[length + i], i < K - 1. Every read of the old
            # state happens before the barrier, every write after it: no thread overwrites an entry that
            # another thread of this program has yet to read.
            pos = length + r
            old_ok = r_ok & (pos < KERNEL - 1)
            new_ok = r_ok & (pos >= KERNEL - 1)
            old = tl.load(
                state_ptrs + pos[:, None], mask=(old_ok & keep)[:, None] & col_ok[None, :], other=0.0
            )
            new = tl.load(
                x_ptr + (seq_start + pos - (KERNEL - 1)).to(tl.int64)[:, None] * x_stride_t + x_cols[None, :],
                mask=new_ok[:, None] & col_ok[None, :],
                other=0.0,
            )
            state = tl.where(old_ok[:, None], old.to(x_ptr.dtype.element_ty), new)
            tl.debug_barrier()
            tl.store(
                state_ptrs + r[:, None],
                state.to(states_ptr.dtype.element_ty),
                mask=r_ok[:, None] & col_ok[None, :],
            )


# Tile of the varlen prefill conv: BLOCK_T tokens x BLOCK_C channels per program (the 27B shape
# T=7680, C=10240 -> 241 x 80 programs). Memory bound: x read once from HBM (the K - 1 halo rows and
# the shifted taps hit L1/L2), out written once. 4 warps: 120 us at that shape on the H200 (2.6 TB/s,
# bench/results/kernels_h200_2026-12-02_session3.json), against 228 us with 8 warps (fewer registers,
# ~74 vs ~126 on sm_90, but half the bytes in flight per program); BLOCK_T=16 measured the same.
_VARLEN_BLOCK_T = 32
_VARLEN_BLOCK_C = 128
_VARLEN_NUM_WARPS = 4
_MIN_SPLIT_BLOCK_C = 16  # split points must be multiples of this to split inside the kernel


def _split_block_c(block_c: int, split_points: list[int]) -> int | None:
    """The largest power-of-two channel block <= block_c that divides every split point, or None."""
    while block_c >= _MIN_SPLIT_BLOCK_C:
        if all(p % block_c == 0 for p in split_points):
            return block_c
        block_c //= 2
    return None


def _launch_causal_conv1d_varlen(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_states: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    split_sizes: tuple[int, ...],
    activation: str | None,
    block_t: int = _VARLEN_BLOCK_T,
    block_c: int = _VARLEN_BLOCK_C,
    num_warps: int = _VARLEN_NUM_WARPS,
) -> tuple[torch.Tensor, ...]:
    """Validates, allocates the split outputs, launches ``_causal_conv1d_varlen_kernel``."""
    num_tokens, channels = x.shape
    kernel = weight.shape[-1]
    batch = state_slots.shape[0]
    assert activation in (None, "silu"), f"activation={activation!r}: only 'silu' or None are supported"
    assert kernel >= 2 and weight.shape == (channels, kernel) and weight.is_contiguous(), tuple(weight.shape)
    assert conv_states.dim() == 3 and conv_states.shape[1:] == (channels, kernel - 1), (
        f"conv_states {tuple(conv_states.shape)} for C={channels}, K={kernel}"
    )
    assert conv_states.is_contiguous(), "conv_states must be contiguous"
    assert cu_seqlens.shape == (batch + 1,) and has_initial_state.shape == (batch,), (
        f"cu_seqlens {tuple(cu_seqlens.shape)}, has_initial_state {tuple(has_initial_state.shape)}, B={batch}"
    )
    assert sum(split_sizes) == channels and all(s > 0 for s in split_sizes), f"{split_sizes} vs C={channels}"
    assert block_t >= kernel - 1, f"block_t={block_t} < K - 1: tile 0 must hold every state-reading token"
    points = [sum(split_sizes[: i + 1]) for i in range(len(split_sizes) - 1)]
    split_block_c = _split_block_c(block_c, points) if len(split_sizes) <= 3 else None
    if split_block_c is None:  # odd split points: convolve into one [T, C], then copy the groups out
        (out,) = _launch_causal_conv1d_varlen(
            x, weight, conv_states, cu_seqlens, state_slots, has_initial_state, (channels,), activation,
            block_t, block_c, num_warps,
        )  # fmt: skip
        return tuple(part.contiguous() for part in out.split(list(split_sizes), dim=-1))
    split_1, split_2 = (points + [channels, channels])[:2]
    flat = torch.empty(num_tokens * channels, dtype=x.dtype, device=x.device)
    outs, offset = [], 0
    for size in split_sizes:
        outs.append(flat[offset : offset + num_tokens * size].view(num_tokens, size))
        offset += num_tokens * size
    if batch == 0 or num_tokens == 0:
        return tuple(outs)
    num_channel_blocks = triton.cdiv(channels, split_block_c)
    grid = ((num_tokens // block_t + batch) * num_channel_blocks,)
    _causal_conv1d_varlen_kernel[grid](
        x, weight, conv_states, cu_seqlens, state_slots, has_initial_state, flat,
        batch, num_tokens, channels, num_channel_blocks,
        x.stride(0), x.stride(1), split_1, split_2,
        KERNEL=kernel, SILU=activation == "silu", BLOCK_T=block_t, BLOCK_C=split_block_c,
        BLOCK_K=triton.next_power_of_2(kernel - 1), SEARCH_STEPS=max(batch - 1, 0).bit_length(),
        num_warps=num_warps,
    )  # fmt: skip
    return tuple(outs)


def causal_conv1d_varlen(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_states: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    activation: str | None = "silu",
) -> torch.Tensor:
    """Launcher for ``causal_conv1d_varlen_ref`` (same contract; no host sync).

    x may have any strides (no ``.contiguous()`` needed); the output is a contiguous [T, C]. Slots are
    >= 0 and distinct within the batch; rows past ``cu_seqlens[-1]`` are left unwritten.
    """
    if not use_triton(x, weight, conv_states, cu_seqlens, state_slots, has_initial_state):
        return causal_conv1d_varlen_ref(
            x, weight, conv_states, cu_seqlens, state_slots, has_initial_state, activation
        )
    (out,) = _launch_causal_conv1d_varlen(
        x, weight, conv_states, cu_seqlens, state_slots, has_initial_state, (x.shape[1],), activation
    )
    return out


def causal_conv1d_varlen_split(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_states: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    split_sizes: tuple[int, ...],
    activation: str | None = "silu",
) -> tuple[torch.Tensor, ...]:
    """Launcher for ``causal_conv1d_varlen_split_ref`` (same contract; no host sync).

    The kernel writes each channel group straight into its own contiguous tensor when there are at most
    three groups whose boundaries are multiples of 16 (the GDN q | k | v split); otherwise it convolves
    into one [T, C] and copies the groups out.
    """
    if not use_triton(x, weight, conv_states, cu_seqlens, state_slots, has_initial_state):
        return causal_conv1d_varlen_split_ref(
            x, weight, conv_states, cu_seqlens, state_slots, has_initial_state, split_sizes, activation
        )
    return _launch_causal_conv1d_varlen(
        x, weight, conv_states, cu_seqlens, state_slots, has_initial_state, tuple(split_sizes), activation
    )
