"""Gated delta rule references (the Gated DeltaNet token mixer).

Per value head, with key dim ``Dk`` and value dim ``Dv``, the state ``S`` is a ``[Dk, Dv]`` fp32
matrix. For each token, with ``q, k`` L2-normalised (eps 1e-6) and ``q`` scaled by ``Dk ** -0.5``:

    S     = exp(g_t) * S                       # gated decay, g_t <= 0
    delta = beta_t * (v_t - S^T k_t)           # delta-rule correction
    S     = S + k_t delta^T
    o_t   = S^T q_t

Grouped value attention: q/k have ``Hk`` heads and v has ``Hv = r * Hk``; key head ``h`` serves the
``r`` consecutive value heads ``h * r .. h * r + r - 1``.

``recurrent_gated_delta_rule_ref`` runs that loop literally (decode). ``chunk_gated_delta_rule_ref``
computes the same result a chunk at a time (prefill). Inside a chunk, with ``G_i`` the cumulative
log-decay up to token ``i`` and ``S0`` the state at the chunk start, the corrections solve the
unit-lower-triangular system

    delta_i + beta_i * sum_{j<i} exp(G_i - G_j) (k_i . k_j) delta_j = beta_i * (v_i - exp(G_i) S0^T k_i)

and then ``o_i = exp(G_i) S0^T q_i + sum_{j<=i} exp(G_i - G_j) (q_i . k_j) delta_j`` and
``S_end = exp(G_L) S0 + sum_j exp(G_L - G_j) k_j delta_j^T``. Both forms start from an optional
initial state and return the final state, so chunked prefill can hand off to recurrent decode.

Decode (``gated_delta_rule_decode_ref`` and its Triton launcher ``gated_delta_rule_decode``) is one
recurrent step per sequence with the states in a slot pool, and takes the gate *inputs*: with the
layer's ``A_log`` and ``dt_bias``, ``g = -exp(A_log) * softplus(a + dt_bias)`` and ``beta = sigmoid(b)``
(``gdn_gate_ref``), so the whole step after the conv is one launch. The new state goes back to the slot it
was read from, or with ``out_slots`` to another slot (a speculative verify's per-position snapshots).

Prefill on CUDA: ``chunk_gated_delta_rule`` runs fla-core's ``chunk_gated_delta_rule`` (the field's
Triton kernels; optional dependency, same semantics) when it imports, else the reference.
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


def l2norm_ref(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x * rsqrt(sum(x^2) + eps)`` over the last dim (the FLA / HF convention)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _prepare_qk(
    q: torch.Tensor, k: torch.Tensor, num_v_heads: int, scale: float | None, use_qk_l2norm: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32, optional L2 norm, q scaled, key heads repeated to the value heads. [..., Hk, Dk] -> [..., Hv, Dk]."""
    qf, kf = q.float(), k.float()
    if use_qk_l2norm:
        qf, kf = l2norm_ref(qf), l2norm_ref(kf)
    qf = qf * (scale if scale is not None else q.shape[-1] ** -0.5)
    ratio = num_v_heads // q.shape[-2]
    if ratio > 1:
        qf = qf.repeat_interleave(ratio, dim=-2)
        kf = kf.repeat_interleave(ratio, dim=-2)
    return qf, kf


def _initial(state: torch.Tensor | None, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.float32, device=device) if state is None else state.float().clone()


def recurrent_gated_delta_rule_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token gated delta rule.

    q, k: [B, T, Hk, Dk]; v: [B, T, Hv, Dv]; g, beta: [B, T, Hv]; initial_state: [B, Hv, Dk, Dv] or None
    -> (o [B, T, Hv, Dv] in v.dtype, final_state [B, Hv, Dk, Dv] fp32).
    """
    batch, num_tokens, num_v_heads, v_dim = v.shape
    qf, kf = _prepare_qk(q, k, num_v_heads, scale, use_qk_l2norm)
    vf, gf, bf = v.float(), g.float(), beta.float()
    state = _initial(initial_state, (batch, num_v_heads, k.shape[-1], v_dim), v.device)
    out = torch.empty(batch, num_tokens, num_v_heads, v_dim, dtype=torch.float32, device=v.device)
    for t in range(num_tokens):
        state = state * gf[:, t].exp()[..., None, None]
        predicted = torch.einsum("bhkv,bhk->bhv", state, kf[:, t])
        delta = (vf[:, t] - predicted) * bf[:, t, :, None]
        state = state + kf[:, t, :, :, None] * delta[:, :, None, :]
        out[:, t] = torch.einsum("bhkv,bhk->bhv", state, qf[:, t])
    return out.to(v.dtype), state


def _chunk_step(
    qc: torch.Tensor,
    kc: torch.Tensor,
    vc: torch.Tensor,
    gc: torch.Tensor,
    bc: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk for all heads. qc, kc: [H, L, Dk]; vc: [H, L, Dv]; gc, bc: [H, L]; state: [H, Dk, Dv]."""
    length = gc.shape[-1]
    cum = gc.cumsum(dim=-1)  # [H, L]
    causal = torch.ones(length, length, dtype=torch.bool, device=gc.device).tril()
    log_decay = (cum[:, :, None] - cum[:, None, :]).masked_fill(~causal, float("-inf"))
    decay = log_decay.exp()  # [H, L, L], decay[i, j] = exp(G_i - G_j) for j <= i, else 0
    strict = decay.masked_fill(torch.eye(length, dtype=torch.bool, device=gc.device), 0.0)
    system = torch.eye(length, device=gc.device) + bc[:, :, None] * strict * (kc @ kc.transpose(-1, -2))
    start_decay = cum.exp()[:, :, None]  # [H, L, 1]
    rhs = bc[:, :, None] * (vc - start_decay * (kc @ state))
    delta = torch.linalg.solve_triangular(system, rhs, upper=False)  # [H, L, Dv]
    out = start_decay * (qc @ state) + (decay * (qc @ kc.transpose(-1, -2))) @ delta
    end_decay = (cum[:, -1:] - cum).exp()[:, :, None]  # [H, L, 1]
    new_state = cum[:, -1].exp()[:, None, None] * state + (kc * end_decay).transpose(-1, -2) @ delta
    return out, new_state


def chunk_gated_delta_rule_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = 64,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked gated delta rule (same contract as ``recurrent_gated_delta_rule_ref`` plus ``chunk_size``).

    q, k: [B, T, Hk, Dk]; v: [B, T, Hv, Dv]; g, beta: [B, T, Hv]; initial_state: [B, Hv, Dk, Dv] or None
    -> (o [B, T, Hv, Dv] in v.dtype, final_state [B, Hv, Dk, Dv] fp32).
    """
    batch, num_tokens, num_v_heads, v_dim = v.shape
    qf, kf = _prepare_qk(q, k, num_v_heads, scale, use_qk_l2norm)
    # [B, H, T, D] / [B, H, T] so that one chunk is a contiguous slice on dim 2.
    qf, kf, vf = (x.transpose(1, 2) for x in (qf, kf, v.float()))
    gf, bf = g.float().transpose(1, 2), beta.float().transpose(1, 2)
    state = _initial(initial_state, (batch, num_v_heads, k.shape[-1], v_dim), v.device)
    out = torch.empty(batch, num_v_heads, num_tokens, v_dim, dtype=torch.float32, device=v.device)
    for b in range(batch):
        for start in range(0, num_tokens, chunk_size):
            sl = slice(start, min(start + chunk_size, num_tokens))
            out[b, :, sl], state[b] = _chunk_step(
                qf[b, :, sl], kf[b, :, sl], vf[b, :, sl], gf[b, :, sl], bf[b, :, sl], state[b]
            )
    return out.transpose(1, 2).to(v.dtype), state


def gated_delta_rule_varlen_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    states: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
) -> torch.Tensor:
    """A flat batch of B sequence chunks whose recurrent states live in a slot pool.

    q, k: [T, Hk, Dk]; v: [T, Hv, Dv]; g, beta: [T, Hv]; states: [num_slots, Hv, Dk, Dv] fp32, read
    and overwritten in place for every slot used; cu_seqlens: [B + 1]; state_slots: [B];
    has_initial_state: [B] bool -> o [T, Hv, Dv]. Single-token sequences (decode) go through the
    recurrent form together; longer chunks go through the chunked form one by one.
    """
    bounds, slots, cont = cu_seqlens.tolist(), state_slots.tolist(), has_initial_state.tolist()
    out = torch.empty_like(v)
    single = [b for b in range(len(slots)) if bounds[b + 1] - bounds[b] == 1]
    if single:
        rows = torch.tensor([bounds[b] for b in single], device=v.device)
        slot_ids = torch.tensor([slots[b] for b in single], device=v.device)
        keep = torch.tensor([cont[b] for b in single], device=v.device)
        initial = torch.where(keep[:, None, None, None], states[slot_ids].float(), 0.0)
        o, final = recurrent_gated_delta_rule_ref(
            q[rows, None],
            k[rows, None],
            v[rows, None],
            g[rows, None],
            beta[rows, None],
            initial,
            scale,
            use_qk_l2norm,
        )
        out[rows] = o[:, 0]
        states[slot_ids] = final.to(states.dtype)
    for b, slot in enumerate(slots):
        start, end = bounds[b], bounds[b + 1]
        if end - start <= 1:
            continue
        initial = states[slot : slot + 1] if cont[b] else None
        sl = slice(start, end)
        o, final = chunk_gated_delta_rule_ref(
            q[None, sl],
            k[None, sl],
            v[None, sl],
            g[None, sl],
            beta[None, sl],
            initial,
            scale=scale,
            use_qk_l2norm=use_qk_l2norm,
        )
        out[sl] = o[0]
        states[slot] = final[0].to(states.dtype)
    return out


def gdn_gate_ref(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated DeltaNet gates from their projections (as the HF model computes them).

    a, b: [..., Hv]; A_log, dt_bias: [Hv] -> (g [..., Hv] fp32 log-decay, beta [..., Hv] in b.dtype).
    """
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return g, torch.sigmoid(b)


def gated_delta_rule_decode_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    states: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    out_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """One recurrent step for each of B sequences, states in a slot pool, gates from their inputs.

    q, k: [B, Hk, Dk]; v: [B, Hv, Dv]; a, b: [B, Hv] (``gdn_gate_ref``); A_log, dt_bias: [Hv];
    states: [num_slots, Hv, Dk, Dv] fp32; state_slots: [B] int, where each row's state is read (-1 =
    padding row: output zeros, no state read or written); has_initial_state: [B] bool; out_slots: [B] int,
    where each row's updated state is written (None: ``state_slots``, in place; -1 writes nothing; a slot
    must not be another row's read slot) -> o [B, Hv, Dv].
    """
    out = torch.zeros_like(v)
    rows = (state_slots >= 0).nonzero().flatten()
    if rows.numel() == 0:
        return out
    slots = state_slots[rows].long()
    keep = has_initial_state[rows].bool()[:, None, None, None]
    initial = torch.where(keep, states[slots].float(), 0.0)
    g, beta = gdn_gate_ref(a[rows], b[rows], A_log, dt_bias)
    o, final = recurrent_gated_delta_rule_ref(
        q[rows, None], k[rows, None], v[rows, None], g[:, None], beta[:, None], initial, scale, use_qk_l2norm
    )
    out[rows] = o[:, 0]
    dst = slots if out_slots is None else out_slots[rows].long()
    states[dst[dst >= 0]] = final[dst >= 0].to(states.dtype)
    return out


if HAS_TRITON:

    @triton.jit
    def _gated_delta_rule_decode_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        a_ptr,
        b_ptr,
        a_log_ptr,
        dt_bias_ptr,
        states_ptr,
        slots_ptr,
        out_slots_ptr,
        keep_ptr,
        out_ptr,
        slots_stride,
        out_slots_stride,
        q_stride,
        k_stride,
        v_stride,
        a_stride,
        b_stride,
        out_stride,
        scale,
        NUM_V_HEADS: tl.constexpr,
        HEAD_RATIO: tl.constexpr,
        K_DIM: tl.constexpr,
        V_DIM: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BLOCK_V: tl.constexpr,
        USE_QK_L2NORM: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # grid (B, Hv, cdiv(Dv, BLOCK_V)): one program owns the [Dk, BLOCK_V] columns of one value head's
        # fp32 state: read once from slot ``slots[row]``, decay, delta-rule update, write once to slot
        # ``out_slots[row]`` (the same slot in place; none when negative); its output slice is S^T q.
        pdl_wait(PDL)  # kernels/pdl.py: before any read of a predecessor's output or any write
        pdl_launch_dependents(PDL)
        row = tl.program_id(0)
        head = tl.program_id(1)
        offs_k = tl.arange(0, BLOCK_K)
        offs_v = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
        k_mask = offs_k < K_DIM
        v_mask = offs_v < V_DIM
        out_ptrs = out_ptr + row * out_stride + head * V_DIM + offs_v
        slot = tl.load(slots_ptr + row * slots_stride).to(tl.int64)
        if slot < 0:
            tl.store(out_ptrs, tl.zeros([BLOCK_V], dtype=out_ptr.dtype.element_ty), mask=v_mask)
            return
        out_slot = tl.load(out_slots_ptr + row * out_slots_stride).to(tl.int64)
        key_head = head // HEAD_RATIO
        q = tl.load(q_ptr + row * q_stride + key_head * K_DIM + offs_k, mask=k_mask, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + row * k_stride + key_head * K_DIM + offs_k, mask=k_mask, other=0.0).to(tl.float32)
        if USE_QK_L2NORM:
            q = q * tl.rsqrt(tl.sum(q * q) + 1e-6)
            k = k * tl.rsqrt(tl.sum(k * k) + 1e-6)
        q = q * scale
        v = tl.load(v_ptr + row * v_stride + head * V_DIM + offs_v, mask=v_mask, other=0.0).to(tl.float32)
        # gates: g = -exp(A_log) * softplus(a + dt_bias) in fp32; beta = sigmoid(b) rounded to b's dtype
        x = tl.load(a_ptr + row * a_stride + head).to(tl.float32) + tl.load(dt_bias_ptr + head).to(tl.float32)
        softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))
        decay = tl.exp(-tl.exp(tl.load(a_log_ptr + head).to(tl.float32)) * softplus)
        b_raw = tl.load(b_ptr + row * b_stride + head)
        beta = tl.sigmoid(b_raw.to(tl.float32)).to(b_raw.dtype).to(tl.float32)
        keep = tl.load(keep_ptr + row) != 0
        head_offs = offs_k[:, None] * V_DIM + offs_v[None, :]
        state_ptrs = states_ptr + (slot * NUM_V_HEADS + head) * (K_DIM * V_DIM) + head_offs
        mask = k_mask[:, None] & v_mask[None, :]
        state = tl.load(state_ptrs, mask=mask & keep, other=0.0) * decay
        delta = (v - tl.sum(state * k[:, None], axis=0)) * beta
        state = state + k[:, None] * delta[None, :]
        out_state_ptrs = states_ptr + (out_slot * NUM_V_HEADS + head) * (K_DIM * V_DIM) + head_offs
        tl.store(out_state_ptrs, state, mask=mask & (out_slot >= 0))
        o = tl.sum(state * q[:, None], axis=0)
        tl.store(out_ptrs, o.to(out_ptr.dtype.element_ty), mask=v_mask)


def gated_delta_rule_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    states: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    out_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Launcher for ``gated_delta_rule_decode_ref`` (same contract; no host sync, CUDA-graph safe).

    q, k, v, a, b may be strided views (e.g. slices of the conv output) as long as each row is a
    unit-stride [heads, dim] block; state_slots and out_slots any 1-D views (a column of a slot table).
    """
    tensors = (q, k, v, a, b, A_log, dt_bias, states, state_slots, has_initial_state)
    if not use_triton(*tensors, out_slots):
        return gated_delta_rule_decode_ref(
            *tensors, scale=scale, use_qk_l2norm=use_qk_l2norm, out_slots=out_slots
        )
    out_slots = state_slots if out_slots is None else out_slots
    batch, num_k_heads, k_dim = q.shape
    num_v_heads, v_dim = v.shape[1:]
    assert k.shape == q.shape and v.shape[0] == batch and num_v_heads % num_k_heads == 0, (
        f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    )
    for name, t, inner in (("q", q, k_dim), ("k", k, k_dim), ("v", v, v_dim)):
        assert t.stride(2) == 1 and t.stride(1) == inner, (
            f"{name}: each row must be a unit-stride [H, D] block"
        )
    for name, t in (("a", a), ("b", b)):
        assert t.shape == (batch, num_v_heads) and t.stride(1) == 1, f"{name} {tuple(t.shape)}"
    assert A_log.shape == (num_v_heads,) and dt_bias.shape == (num_v_heads,)
    assert states.dtype == torch.float32 and states.is_contiguous(), "states: contiguous fp32 pool"
    assert states.shape[1:] == (num_v_heads, k_dim, v_dim), f"states {tuple(states.shape)}"
    assert (
        state_slots.shape == (batch,) and out_slots.shape == (batch,) and has_initial_state.shape == (batch,)
    )
    out = torch.empty(batch, num_v_heads, v_dim, dtype=v.dtype, device=v.device)
    block_k = triton.next_power_of_2(k_dim)
    block_v = min(32, triton.next_power_of_2(v_dim))
    if batch:
        _gated_delta_rule_decode_kernel[(batch, num_v_heads, triton.cdiv(v_dim, block_v))](
            q, k, v, a, b, A_log, dt_bias, states, state_slots, out_slots, has_initial_state, out,
            state_slots.stride(0), out_slots.stride(0), q.stride(0), k.stride(0), v.stride(0), a.stride(0), b.stride(0), out.stride(0),
            scale if scale is not None else k_dim**-0.5,
            NUM_V_HEADS=num_v_heads, HEAD_RATIO=num_v_heads // num_k_heads, K_DIM=k_dim, V_DIM=v_dim,
            BLOCK_K=block_k, BLOCK_V=block_v, USE_QK_L2NORM=use_qk_l2norm, num_warps=4, **pdl_args(q.device),
        )  # fmt: skip
    return out


def _fla_chunk() -> object | None:
    """fla-core's ``chunk_gated_delta_rule``, or None when fla-core is not installed."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
    except ImportError:
        return None
    return fla_chunk


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = 64,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launcher for ``chunk_gated_delta_rule_ref`` (same contract) through fla-core's chunked kernels.

    fla-core fixes its chunk size at 64 (the result does not depend on it). Falls back to the
    reference off CUDA, under ``NINFER_KERNELS=ref``, or when fla-core is not installed.
    """
    fla_chunk = _fla_chunk() if use_triton(q, k, v, g, beta, initial_state) else None
    if fla_chunk is None:
        return chunk_gated_delta_rule_ref(q, k, v, g, beta, initial_state, chunk_size, scale, use_qk_l2norm)
    out, final = fla_chunk(  # type: ignore[operator]
        q, k, v, g.float(), beta, scale=scale,
        initial_state=initial_state.float() if initial_state is not None else None,
        output_final_state=True, use_qk_l2norm_in_kernel=use_qk_l2norm,
    )  # fmt: skip
    return out, final
