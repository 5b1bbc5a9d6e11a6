"""Pure-torch references for the Gated DeltaNet ops (architecture reference §5).

These are the functions every Triton kernel of the GDN path must equal. They compute in
the dtype of their inputs (fp32 in the model; pass fp64 for tight tests) and never
mutate their arguments. One sequence, token-major layout, no batch dimension:

    x      [T, C]          conv input (projection output u), C = Cc channels
    q, k   [T, Hk, dk]     key/query heads
    v      [T, Hv, dv]     value heads, Hv = R * Hk
    g, beta[T, Hv]         log-decay (<= 0) and write strength, per value head
    state  [Hv, dk, dv]    recurrent state S (key-major, value fastest: HF/FLA layout)

Value head j reads key head kappa(j) = j mod Hk (the GGUF "tiled" mapping, §5.5).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


# -- causal depthwise conv (§5.2, §5.9) ------------------------------------------------


def causal_conv1d_ref(
    x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor | None = None, *, silu: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise conv over time, continuing from `state`.

    x [T, C]; weight [C, K] (tap K-1 multiplies the current token, tap 0 the oldest; no
    flip); state [K-1, C] = the previous K-1 raw inputs, oldest first (zeros at sequence
    start). Returns (y [T, C], new_state [K-1, C]); SiLU applied to y when `silu`.
    """
    T, C = x.shape
    K = weight.shape[1]
    if weight.shape[0] != C:
        raise ValueError(f"conv weight has {weight.shape[0]} channels, input has {C}")
    if state is None:
        state = x.new_zeros(K - 1, C)
    if state.shape != (K - 1, C):
        raise ValueError(f"conv state shape {tuple(state.shape)}, expected {(K - 1, C)}")
    window = torch.cat([state, x], dim=0)  # [K-1+T, C]
    # y_t = sum_i w[:, i] * window[t + i]: window position t+K-1 is token t itself.
    y = sum(window[i : i + T] * weight[:, i] for i in range(K))
    new_state = window[T:].clone()  # the last K-1 raw inputs
    return (F.silu(y) if silu else y), new_state


# -- q/k normalisation and gates (§5.3, §5.4) -------------------------------------------


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim (HF/FLA placement: eps inside the root)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gdn_gates(
    alpha: torch.Tensor, b: torch.Tensor, ssm_a: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, beta) from the raw per-head projections alpha, b [T, Hv].

    g = ssm_a * softplus(alpha + dt_bias) <= 0 (GGUF ssm_a is already -exp(A_log));
    beta = sigmoid(b). torch's softplus is linear above 20, so it cannot overflow.
    """
    g = ssm_a * F.softplus(alpha + dt_bias)
    return g, torch.sigmoid(b)


def _expand_key_heads(x: torch.Tensor, n_v_head: int) -> torch.Tensor:
    """[T, Hk, d] -> [T, Hv, d] with value head j reading key head j mod Hk (tiled)."""
    T, hk, d = x.shape
    if n_v_head % hk:
        raise ValueError(f"Hv={n_v_head} is not a multiple of Hk={hk}")
    return x[:, None].expand(T, n_v_head // hk, hk, d).reshape(T, n_v_head, d)  # [k0 k1 .. k0 k1 ..]


def _check_gdn_inputs(q, k, v, g, beta, state):
    T, hk, dk = q.shape
    _, hv, dv = v.shape
    if k.shape != q.shape:
        raise ValueError(f"k shape {tuple(k.shape)} != q shape {tuple(q.shape)}")
    if v.shape[0] != T or g.shape != (T, hv) or beta.shape != (T, hv):
        raise ValueError(
            f"expected v [{T}, Hv, dv], g and beta [{T}, {hv}]; got v {tuple(v.shape)}, "
            f"g {tuple(g.shape)}, beta {tuple(beta.shape)}"
        )
    if hv % hk:
        raise ValueError(f"Hv={hv} is not a multiple of Hk={hk}")
    if state is not None and state.shape != (hv, dk, dv):
        raise ValueError(f"state shape {tuple(state.shape)}, expected {(hv, dk, dv)}")
    return T, hk, hv, dk, dv


# -- the gated delta rule, token by token (§5.6) ----------------------------------------


def gated_delta_rule_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None = None,
    *,
    scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule, one token at a time, all value heads at once.

    Per value head j and token t (q, k already L2-normalised; q is multiplied by `scale`):
        S <- exp(g) S;  delta = beta (v - S^T k);  S <- S + k delta^T;  o = S^T q
    Returns (o [T, Hv, dv], final state [Hv, dk, dv]).
    """
    T, hk, hv, dk, dv = _check_gdn_inputs(q, k, v, g, beta, state)
    q = _expand_key_heads(q, hv) * scale
    k = _expand_key_heads(k, hv)
    S = q.new_zeros(hv, dk, dv) if state is None else state.clone()
    out = q.new_empty(T, hv, dv)
    decay = torch.exp(g)[:, :, None, None]  # [T, Hv, 1, 1]
    k_row, q_row = k[:, :, None, :], q[:, :, None, :]  # [T, Hv, 1, dk]: batched row vectors
    for t in range(T):
        S = S * decay[t]
        pred = (k_row[t] @ S).squeeze(1)  # S^T k [Hv, dv]: what the memory recalls for k
        delta = beta[t][:, None] * (v[t] - pred)
        S = S + k[t][:, :, None] * delta[:, None, :]
        out[t] = (q_row[t] @ S).squeeze(1)  # S^T q
    return out, S


# -- the same rule in chunks (§5.8, used for prefill) -----------------------------------


def gated_delta_rule_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None = None,
    *,
    scale: float = 1.0,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked (UT/WY) form of `gated_delta_rule_recurrent`; same arguments and results.

    Per chunk of n <= chunk_size tokens and per value head, with S0 the incoming state:
        Gam = cumsum(g);  A[r,s] = beta_r (k_r.k_s) exp(Gam_r - Gam_s) for s < r
        U = (I+A)^-1 diag(beta) V;  W = (I+A)^-1 diag(beta exp(Gam)) K;  Delta = U - W S0
        O = diag(exp(Gam)) Q S0 + ((Q K^T) * M) Delta,  M[r,s] = exp(Gam_r - Gam_s), s <= r
        S = exp(Gam_n) S0 + (diag(exp(Gam_n - Gam)) K)^T Delta
    A short last chunk is handled directly (no padding). Masks are applied to the exponent
    argument (-inf), so masked entries are exactly 0 and never inf * 0.
    """
    T, hk, hv, dk, dv = _check_gdn_inputs(q, k, v, g, beta, state)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    # Head-major for batched matmuls over value heads: [Hv, T, d].
    Q = (_expand_key_heads(q, hv) * scale).transpose(0, 1)
    K = _expand_key_heads(k, hv).transpose(0, 1)
    V = v.transpose(0, 1)
    G = g.transpose(0, 1)  # [Hv, T]
    B = beta.transpose(0, 1)
    S = q.new_zeros(hv, dk, dv) if state is None else state.clone()
    out = q.new_empty(hv, T, dv)
    neg_inf = torch.tensor(float("-inf"), dtype=q.dtype, device=q.device)
    for c0 in range(0, T, chunk_size):
        c1 = min(c0 + chunk_size, T)
        n = c1 - c0
        Qc, Kc, Vc, Bc = Q[:, c0:c1], K[:, c0:c1], V[:, c0:c1], B[:, c0:c1]
        gam = torch.cumsum(G[:, c0:c1], dim=-1)  # [Hv, n]
        diff = gam[:, :, None] - gam[:, None, :]  # Gam_r - Gam_s, [Hv, n, n]
        idx = torch.arange(n, device=q.device)
        strict = idx[:, None] > idx[None, :]
        causal = idx[:, None] >= idx[None, :]
        decay_strict = torch.exp(torch.where(strict, diff, neg_inf))
        decay_causal = torch.exp(torch.where(causal, diff, neg_inf))
        # Step 1-2: UT transform. A is strictly lower, so I + A is unit lower triangular.
        A = Bc[:, :, None] * (Kc @ Kc.transpose(1, 2)) * decay_strict
        I_plus_A = A + torch.eye(n, dtype=q.dtype, device=q.device)
        rhs = torch.cat([Bc[:, :, None] * Vc, (Bc * torch.exp(gam))[:, :, None] * Kc], dim=-1)
        UW = torch.linalg.solve_triangular(I_plus_A, rhs, upper=False, unitriangular=True)
        U, W = UW[..., :dv], UW[..., dv:]
        # Step 3: the true per-token deltas given the incoming state.
        delta = U - W @ S  # [Hv, n, dv]
        # Step 4: outputs.
        out[:, c0:c1] = (torch.exp(gam)[:, :, None] * Qc) @ S + ((Qc @ Kc.transpose(1, 2)) * decay_causal) @ delta
        # Step 5: state leaving the chunk.
        gam_n = gam[:, -1:]  # [Hv, 1]
        k_decayed = torch.exp(gam_n - gam)[:, :, None] * Kc  # [Hv, n, dk]
        S = torch.exp(gam_n)[:, :, None] * S + k_decayed.transpose(1, 2) @ delta
    return out.transpose(0, 1), S


# -- output norm (§5.7) ----------------------------------------------------------------


def gated_rms_norm_ref(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over each head's dv values (weight used as is, no +1), times SiLU(z).

    o, z [T, Hv, dv]; weight [dv] shared by all heads.
    """
    normed = o * torch.rsqrt(o.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (weight * normed) * F.silu(z)
