"""Gated DeltaNet decode step for one token, one program per value head (dk x dv state in registers).

Input is the fused projection buffer of a GDN layer, [u_bar (Cc) | z (Cv) | b (Hv) | a (Hv)],
where u_bar already went through conv + SiLU in the GEMV epilogue. Per value head j (key head
j mod Hk, GGUF tiled order): L2-norm q, k (q also / sqrt(dk)); beta = sigmoid(b);
g = ssm_a * softplus(a + dt_bias); S <- exp(g) S; delta = beta (v - S^T k); S += k delta^T;
o = S^T q; y = RMSNorm(o; w) * SiLU(z). State fp32 [Hv, dk, dv], value fastest.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..pdl import gdc_launch_dependents, gdc_wait, pdl_launch
from ..tl_utils import gdn_log_decay


@triton.jit
def _gdn_decode_kernel(p_proj, p_state, p_ssm_a, p_dt_bias, p_norm_w, p_out, n_k_head, n_v_head, eps,
                       DK: tl.constexpr, DV: tl.constexpr, PDL: tl.constexpr = False):
    i_v = tl.program_id(0)
    i_k = i_v % n_k_head  # tiled value-head -> key-head mapping (architecture §5.5)
    ck = n_k_head * DK
    cc = 2 * ck + n_v_head * DV
    kk = tl.arange(0, DK)
    vv = tl.arange(0, DV)
    p_s = p_state + i_v.to(tl.int64) * DK * DV + kk[:, None] * DV + vv[None, :]
    if PDL:  # the state is this layer's own (last written a token ago): load it while the in-projection finishes
        gdc_launch_dependents()
        s0 = tl.load(p_s)
        gdc_wait()
    else:
        s0 = tl.load(p_s)
    q = tl.load(p_proj + i_k * DK + kk)
    k = tl.load(p_proj + ck + i_k * DK + kk)
    v = tl.load(p_proj + 2 * ck + i_v * DV + vv)
    q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * (1.0 / tl.sqrt(DK * 1.0))
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)

    b = tl.load(p_proj + cc + n_v_head * DV + i_v)
    a = tl.load(p_proj + cc + n_v_head * DV + n_v_head + i_v)
    beta = 1.0 / (1.0 + tl.exp(-b))
    decay = tl.exp(gdn_log_decay(a, tl.load(p_dt_bias + i_v), tl.load(p_ssm_a + i_v)))

    s = s0 * decay  # [DK, DV]
    delta = beta * (v - tl.sum(s * k[:, None], axis=0))
    s += k[:, None] * delta[None, :]
    tl.store(p_s, s)
    o = tl.sum(s * q[:, None], axis=0)  # [DV]

    z = tl.load(p_proj + cc + i_v * DV + vv)
    y = o * tl.rsqrt(tl.sum(o * o, axis=0) / DV + eps) * tl.load(p_norm_w + vv) * (z / (1.0 + tl.exp(-z)))
    tl.store(p_out + i_v * DV + vv, y)


@triton.jit
def _gdn_decode_split_kernel(p_proj, p_state, p_ssm_a, p_dt_bias, p_out, p_ssq, n_k_head, n_v_head,
                             DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr):
    """The recurrence for value columns [i_s*BV, (i_s+1)*BV) of head i_v (each column needs the whole
    dk axis, so dv splits freely): Hv*dv/BV programs instead of Hv. Writes the raw readout o and the
    partial sum of o^2; _gdn_gated_norm_kernel finishes RMSNorm(o) * SiLU(z) over the whole head."""
    i_v = tl.program_id(0)
    i_s = tl.program_id(1)
    i_k = i_v % n_k_head
    ck = n_k_head * DK
    cc = 2 * ck + n_v_head * DV
    kk = tl.arange(0, DK)
    vv = i_s * BV + tl.arange(0, BV)
    q = tl.load(p_proj + i_k * DK + kk)
    k = tl.load(p_proj + ck + i_k * DK + kk)
    v = tl.load(p_proj + 2 * ck + i_v * DV + vv)
    q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * (1.0 / tl.sqrt(DK * 1.0))
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
    b = tl.load(p_proj + cc + n_v_head * DV + i_v)
    a = tl.load(p_proj + cc + n_v_head * DV + n_v_head + i_v)
    beta = 1.0 / (1.0 + tl.exp(-b))
    decay = tl.exp(gdn_log_decay(a, tl.load(p_dt_bias + i_v), tl.load(p_ssm_a + i_v)))
    p_s = p_state + i_v.to(tl.int64) * DK * DV + kk[:, None] * DV + vv[None, :]
    s = tl.load(p_s) * decay  # [DK, BV]
    delta = beta * (v - tl.sum(s * k[:, None], axis=0))
    s += k[:, None] * delta[None, :]
    tl.store(p_s, s)
    o = tl.sum(s * q[:, None], axis=0)  # [BV]
    tl.store(p_out + i_v * DV + vv, o)
    tl.store(p_ssq + i_v * (DV // BV) + i_s, tl.sum(o * o, axis=0))


@triton.jit
def _gdn_gated_norm_kernel(p_out, p_ssq, p_proj, p_norm_w, n_k_head, n_v_head, eps,
                           DK: tl.constexpr, DV: tl.constexpr, NS: tl.constexpr):
    """y = RMSNorm(o; w) * SiLU(z) per value head, in place over the split kernel's readout."""
    i_v = tl.program_id(0)
    vv = tl.arange(0, DV)
    cc = 2 * n_k_head * DK + n_v_head * DV
    ssq = tl.sum(tl.load(p_ssq + i_v * NS + tl.arange(0, NS)), axis=0)
    o = tl.load(p_out + i_v * DV + vv)
    z = tl.load(p_proj + cc + i_v * DV + vv)
    y = o * tl.rsqrt(ssq / DV + eps) * tl.load(p_norm_w + vv) * (z / (1.0 + tl.exp(-z)))
    tl.store(p_out + i_v * DV + vv, y)


def gdn_decode_step(proj: torch.Tensor, state: torch.Tensor, ssm_a: torch.Tensor, dt_bias: torch.Tensor,
                    norm_weight: torch.Tensor, out: torch.Tensor, *, n_k_head: int, eps: float = 1e-6,
                    num_warps: int | None = None, block_v: int | None = None,
                    ssq: torch.Tensor | None = None, pdl: bool = False) -> torch.Tensor:
    """One token through the recurrence of a GDN layer; updates `state` in place, writes `out` [Hv*dv].

    block_v (< dv, a power of two): split each head's dv columns over dv/block_v programs (more SMs
    busy: Hv is only 16-32) and finish the gated norm in a second small launch; `ssq` is an fp32
    scratch of Hv*dv/block_v partial sums (allocated if not given; pass one for CUDA graphs).
    pdl (one-program-per-head path, CUDA): programmatic dependent launch, the state load overlapping
    the previous kernel (the in-projection GEMV)."""
    if state.dim() != 3 or state.dtype != torch.float32 or not state.is_contiguous():
        raise ValueError(f"gdn_decode_step: state must be contiguous fp32 [Hv, dk, dv], got {tuple(state.shape)} {state.dtype}")
    hv, dk, dv = state.shape
    if hv % n_k_head:
        raise ValueError(f"gdn_decode_step: Hv={hv} is not a multiple of Hk={n_k_head}")
    need = 2 * n_k_head * dk + 2 * hv * dv + 2 * hv
    for name, t, n in (("proj", proj, need), ("ssm_a", ssm_a, hv), ("dt_bias", dt_bias, hv),
                      ("norm_weight", norm_weight, dv), ("out", out, hv * dv)):
        if t.dim() != 1 or t.shape[0] != n or t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"gdn_decode_step: {name} must be contiguous fp32 [{n}], got {tuple(t.shape)} {t.dtype}")
    if triton.next_power_of_2(dk) != dk or triton.next_power_of_2(dv) != dv:
        raise ValueError(f"gdn_decode_step: dk={dk}, dv={dv} must be powers of two")
    cpu = proj.device.type == "cpu"
    if block_v is not None and block_v < dv:
        if triton.next_power_of_2(block_v) != block_v or dv % block_v:
            raise ValueError(f"gdn_decode_step: block_v={block_v} must be a power of two dividing dv={dv}")
        ns = dv // block_v
        if ssq is None:
            ssq = torch.empty(hv * ns, dtype=torch.float32, device=proj.device)
        if ssq.dtype != torch.float32 or ssq.numel() < hv * ns or not ssq.is_contiguous():
            raise ValueError(f"gdn_decode_step: ssq must be contiguous fp32 with >= {hv * ns} elements")
        nw = num_warps or (1 if cpu else max(1, min(8, dk * block_v // 1024)))
        _gdn_decode_split_kernel[(hv, ns)](proj, state, ssm_a, dt_bias, out, ssq, n_k_head, hv,
                                           DK=dk, DV=dv, BV=block_v, num_warps=nw)
        _gdn_gated_norm_kernel[(hv,)](out, ssq, proj, norm_weight, n_k_head, hv, float(eps), DK=dk, DV=dv, NS=ns,
                                      num_warps=1 if cpu else 4)
        return out
    if num_warps is None:
        num_warps = 1 if cpu else 8
    pdl, pdl_kw = pdl_launch(pdl, proj.device, "gdn_decode_step")
    _gdn_decode_kernel[(hv,)](proj, state, ssm_a, dt_bias, norm_weight, out, n_k_head, hv, float(eps),
                              DK=dk, DV=dv, PDL=pdl, num_warps=num_warps, **pdl_kw)
    return out
