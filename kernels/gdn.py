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
"""

from __future__ import annotations

import torch


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
