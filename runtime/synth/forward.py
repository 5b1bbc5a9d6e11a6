"""Batched fp32 prefill logits for the synth statistics (all positions of several prompts).

The report needs logits at every position of many same-length prompts at once; this is the
architecture reference's forward (§3–§6) in its plainest batched form: token-by-token delta
rule, full causal attention, no caches.  Tensors are GGUF-named fp32 torch tensors.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..config import ModelConfig


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x, pos, r, base):  # half-split rotation of the first r dims (§4.3)
    half = r // 2
    inv = base ** (-torch.arange(half, dtype=torch.float32, device=x.device) * 2 / r)
    ang = pos[:, None].float() * inv[None]
    c, s = ang.cos(), ang.sin()
    x1, x2 = x[..., :half], x[..., half:r]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, x[..., r:]], -1)


def _attention(W, p, a, cfg: ModelConfig):
    B, T, _ = a.shape
    hq, hkv, dh = cfg.n_head, cfg.n_kv_head, cfg.head_dim
    proj = (a @ W[p + "attn_q.weight"].T).view(B, T, hq, 2 * dh)
    q, z = proj[..., :dh], proj[..., dh:]
    k = (a @ W[p + "attn_k.weight"].T).view(B, T, hkv, dh)
    v = (a @ W[p + "attn_v.weight"].T).view(B, T, hkv, dh)
    pos = torch.arange(T, device=a.device)
    q = _rope(_rms(q, W[p + "attn_q_norm.weight"], cfg.rms_eps).transpose(1, 2), pos, cfg.rope_dims, cfg.rope_base)
    k = _rope(_rms(k, W[p + "attn_k_norm.weight"], cfg.rms_eps).transpose(1, 2), pos, cfg.rope_dims, cfg.rope_base)
    g = hq // hkv
    k, v = k.repeat_interleave(g, 1), v.transpose(1, 2).repeat_interleave(g, 1)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(dh)
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=a.device).triu(1), float("-inf"))
    o = (s.softmax(-1) @ v).transpose(1, 2) * torch.sigmoid(z)
    return o.reshape(B, T, hq * dh) @ W[p + "attn_output.weight"].T


def _deltanet(W, p, a, cfg: ModelConfig):
    B, T, _ = a.shape
    hk, hv, dk, ck = cfg.n_k_head, cfg.n_v_head, cfg.ssm_head_dim, cfg.key_dim
    u = a @ W[p + "attn_qkv.weight"].T
    cw = W[p + "ssm_conv1d.weight"]
    ub = F.silu(F.conv1d(F.pad(u.transpose(1, 2), (cfg.conv_kernel - 1, 0)), cw[:, None, :], groups=cw.shape[0])).transpose(1, 2)
    q, k = ub[..., :ck].view(B, T, hk, dk), ub[..., ck : 2 * ck].view(B, T, hk, dk)
    v = ub[..., 2 * ck :].view(B, T, hv, dk)
    q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6) / math.sqrt(dk)
    k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
    tiled = torch.arange(hv, device=a.device) % hk  # GGUF value head j reads key head j mod Hk
    q, k = q[:, :, tiled], k[:, :, tiled]
    z = (a @ W[p + "attn_gate.weight"].T).view(B, T, hv, dk)
    beta = torch.sigmoid(a @ W[p + "ssm_beta.weight"].T)
    decay = torch.exp(W[p + "ssm_a"] * F.softplus(a @ W[p + "ssm_alpha.weight"].T + W[p + "ssm_dt.bias"]))
    S = torch.zeros(B, hv, dk, dk, device=a.device)
    outs = []
    for t in range(T):
        S = S * decay[:, t, :, None, None]
        delta = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, t]))
        S = S + k[:, t, :, :, None] * delta[:, :, None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]))
    y = _rms(torch.stack(outs, 1), W[p + "ssm_norm.weight"], cfg.rms_eps) * F.silu(z)
    return y.reshape(B, T, hv * dk) @ W[p + "ssm_out.weight"].T


@torch.no_grad()
def batched_logits(W: dict[str, torch.Tensor], cfg: ModelConfig, ids: torch.Tensor) -> torch.Tensor:
    """ids [B, T] → logits [B, T, V] (fp32)."""
    h = W["token_embd.weight"][ids]
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        a = _rms(h, W[p + "attn_norm.weight"], cfg.rms_eps)
        h = h + (_attention(W, p, a, cfg) if cfg.is_attention(i) else _deltanet(W, p, a, cfg))
        f = _rms(h, W[p + "post_attention_norm.weight"], cfg.rms_eps)
        h = h + (F.silu(f @ W[p + "ffn_gate.weight"].T) * (f @ W[p + "ffn_up.weight"].T)) @ W[p + "ffn_down.weight"].T
    head = W.get("output.weight", W["token_embd.weight"])
    return _rms(h, W["output_norm.weight"], cfg.rms_eps) @ head.T
