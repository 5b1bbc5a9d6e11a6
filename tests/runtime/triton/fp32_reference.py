"""fp32 reference forward for the prefill tests, built from the kernels' naive.py functions on
dequantized weights (until runtime/models/qwen35_reference.py is on main)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from runtime.kernels.attn_prep.naive import rope_tables
from runtime.kernels.gdn_chunk.naive import gdn_chunk_naive
from runtime.kernels.gdn_conv.naive import gdn_conv_naive


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class Fp32Reference:
    def __init__(self, model, max_context: int = 512):
        self.cfg = cfg = model.config
        self.w = {n: qt.dequantize().reshape(qt.shape).float() for n, qt in model.tensors.items()}
        self.head = self.w["token_embd.weight"] if cfg.tied_embeddings else self.w["output.weight"]
        n_gdn, n_attn = len(cfg.deltanet_layers), len(cfg.attention_layers)
        self.conv = [torch.zeros(cfg.conv_kernel - 1, cfg.conv_channels) for _ in range(n_gdn)]
        self.ssm = [torch.zeros(cfg.n_v_head, cfg.ssm_head_dim, cfg.ssm_head_dim) for _ in range(n_gdn)]
        self.k = [torch.zeros(max_context, cfg.n_kv_head, cfg.head_dim) for _ in range(n_attn)]
        self.v = [torch.zeros(max_context, cfg.n_kv_head, cfg.head_dim) for _ in range(n_attn)]
        self.position = 0

    def forward(self, ids) -> torch.Tensor:
        """fp32 logits [T, V] for every new token."""
        cfg, w = self.cfg, self.w
        ids = torch.as_tensor(ids, dtype=torch.long)
        t, p0 = ids.shape[0], self.position
        h = w["token_embd.weight"][ids]
        ig = ia = 0
        for layer in range(cfg.n_layers):
            p = f"blk.{layer}."
            a = _rms(h, w[p + "attn_norm.weight"], cfg.rms_eps)
            if cfg.is_attention(layer):
                h = h + self._attn(p, a, ia, p0)
                ia += 1
            else:
                h = h + self._gdn(p, a, ig)
                ig += 1
            f = _rms(h, w[p + "post_attention_norm.weight"], cfg.rms_eps)
            h = h + F.linear(F.silu(F.linear(f, w[p + "ffn_gate.weight"])) * F.linear(f, w[p + "ffn_up.weight"]),
                             w[p + "ffn_down.weight"])
        self.position += t
        return F.linear(_rms(h, w["output_norm.weight"], cfg.rms_eps), self.head)

    def _gdn(self, p, a, i):
        cfg, w = self.cfg, self.w
        t, hv = a.shape[0], cfg.n_v_head
        u = gdn_conv_naive(F.linear(a, w[p + "attn_qkv.weight"]), w[p + "ssm_conv1d.weight"], self.conv[i])
        o = gdn_chunk_naive(u, F.linear(a, w[p + "ssm_alpha.weight"]), F.linear(a, w[p + "ssm_beta.weight"]),
                            w[p + "ssm_a"], w[p + "ssm_dt.bias"], self.ssm[i], n_k_head=cfg.n_k_head)
        z = F.linear(a, w[p + "attn_gate.weight"]).reshape(t, hv, -1)
        y = _rms(o, w[p + "ssm_norm.weight"], cfg.rms_eps) * F.silu(z)
        return F.linear(y.reshape(t, -1), w[p + "ssm_out.weight"])

    def _attn(self, p, a, i, p0):
        cfg, w = self.cfg, self.w
        t, hq, hkv, dh = a.shape[0], cfg.n_head, cfg.n_kv_head, cfg.head_dim
        qg = F.linear(a, w[p + "attn_q.weight"]).reshape(t, hq, 2 * dh)
        q, gate = qg[..., :dh], qg[..., dh:]
        k = F.linear(a, w[p + "attn_k.weight"]).reshape(t, hkv, dh)
        v = F.linear(a, w[p + "attn_v.weight"]).reshape(t, hkv, dh)
        cos, sin = rope_tables(torch.arange(p0, p0 + t), cfg.rope_dims, cfg.rope_base)

        def norm_rope(x, wn):
            x = _rms(x, wn, cfg.rms_eps)
            half = cos.shape[1]
            x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
            c, s = cos[:, None], sin[:, None]
            return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, rest], -1)

        q, k = norm_rope(q, w[p + "attn_q_norm.weight"]), norm_rope(k, w[p + "attn_k_norm.weight"])
        self.k[i][p0 : p0 + t], self.v[i][p0 : p0 + t] = k, v
        n = p0 + t
        kk = self.k[i][:n].repeat_interleave(hq // hkv, 1)
        vv = self.v[i][:n].repeat_interleave(hq // hkv, 1)
        s = torch.einsum("thd,nhd->htn", q, kk) * dh**-0.5
        s = s.masked_fill(torch.arange(n)[None, :] > torch.arange(p0, n)[:, None], float("-inf"))
        o = torch.einsum("htn,nhd->thd", torch.softmax(s, -1), vv) * torch.sigmoid(gate)
        return F.linear(o.reshape(t, -1), w[p + "attn_output.weight"])
