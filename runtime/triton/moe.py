"""The qwen35moe FFN in the Triton engine: decode (inside the CUDA-graph step) and prefill.

Decode, per layer (all on the device, fixed shapes, no host sync):
  gemv(h -> [router | shared gate]) with the fused pre-FFN RMSNorm   logits [E + 1]
  moe_route                                                           ids [k], weights [k]
  experts_swiglu_gemv (norm in-kernel) over the k chosen experts      act [k + 1, Fe]
    and the shared expert as slot k (the default tile's fold)
  experts_down_gemv: h += Σ w_j D_j act_j + sigmoid(gate) · D_s act_k
Without the fold (a tile that does not ask for it, or a shared expert of another width) the shared expert runs as
its own two GEMVs before the expert launches, and the down launch adds sigmoid(gate) · shared.
Prefill: router / shared gate as fp32 matmuls, the shared expert through the dense prefill GEMMs,
the routed experts as a grouped GEMM over token-sorted experts (kernels/moe_experts).
"""
from __future__ import annotations

import torch

from ..kernels.gemv import gemv
from ..kernels.moe_experts import experts_down_gemv, experts_swiglu_gemv, grouped_experts
from ..kernels.moe_route import moe_route
from ..kernels.quant_x import Q8Vector
from ..kernels.qgemm import qgemm, qgemm_swiglu


class MoeDecodeBuffers:
    def __init__(self, cfg, device):
        f32 = dict(dtype=torch.float32, device=device)
        self.logits = torch.zeros(cfg.n_expert + 1, **f32)  # router logits | shared-expert gate logit
        self.ids = torch.zeros(1, cfg.n_expert_used, dtype=torch.int32, device=device)
        self.weights = torch.zeros(1, cfg.n_expert_used, **f32)
        self.act = torch.zeros(cfg.n_expert_used + 1, cfg.d_ffn_exp, **f32)  # + the folded shared expert's row
        self.shared_act = torch.zeros(cfg.d_ffn_shexp, **f32)
        self.shared = torch.zeros(cfg.d_model, **f32)
        self.part = torch.zeros(cfg.n_expert_used + 1, cfg.d_model, **f32)  # a split down launch's per-slot sums
        # the int8-x expert paths' quantized input and activation rows (static addresses for the CUDA graph)
        self.q8_x = Q8Vector.empty(cfg.d_model, device)
        self.q8_act = Q8Vector.empty((cfg.n_expert_used + 1) * cfg.d_ffn_exp, device)


def decode_ffn(step, p: str) -> None:
    """One decode token's MoE FFN for layer prefix `p`; updates the residual step.b.h in place."""
    cfg, w, b = step.cfg, step.w, step.b
    mb, mat, gc = b.moe, w.mat, step.gemv_config
    h = b.h[0]
    norm = w.vec[p + "post_attention_norm.weight"]
    gemv(h, [mat[p + "ffn_gate_inp.weight"], mat[p + "ffn_gate_inp_shexp.weight"]], mb.logits,
         norm_weight=norm, eps=cfg.rms_eps, config=gc, q8=b.q8)
    moe_route(mb.logits[: cfg.n_expert].view(1, -1), cfg.n_expert_used, ids=mb.ids, weights=mb.weights)
    g, u, d = mat[p + "ffn_gate_exps.weight"], mat[p + "ffn_up_exps.weight"], mat[p + "ffn_down_exps.weight"]
    sg, su, sd = mat[p + "ffn_gate_shexp.weight"], mat[p + "ffn_up_shexp.weight"], mat[p + "ffn_down_shexp.weight"]
    et, k = step.expert_tile, cfg.n_expert_used
    ids, weights, slogit = mb.ids[0], mb.weights[0], mb.logits[cfg.n_expert:]
    if et.fold_shared:  # the shared expert as slot k of both expert launches: two launches fewer a layer
        if cfg.d_ffn_shexp != cfg.d_ffn_exp:
            raise ValueError(f"ExpertTile.fold_shared: the shared expert's width {cfg.d_ffn_shexp} is not the routed "
                             f"experts' {cfg.d_ffn_exp}")
        experts_swiglu_gemv(h, norm, cfg.rms_eps, g.data, g.qtype, u.data, u.qtype, ids, cfg.d_ffn_exp, mb.act,
                            tile=et, q8=mb.q8_x, shared=(sg.data, sg.qtype, su.data, su.qtype))
        experts_down_gemv(mb.act, d.data, d.qtype, ids, weights, h, h, shared_logit=slogit, tile=et, part=mb.part,
                          q8=mb.q8_act, shared_down=(sd.data, sd.qtype))
        return
    gemv(h, [sg, su], mb.shared_act, norm_weight=norm, eps=cfg.rms_eps, swiglu=True, config=gc, q8=b.q8)
    gemv(mb.shared_act, [sd], mb.shared, config=gc, q8=b.q8)
    experts_swiglu_gemv(h, norm, cfg.rms_eps, g.data, g.qtype, u.data, u.qtype, ids, cfg.d_ffn_exp, mb.act[:k],
                        tile=et, q8=mb.q8_x)
    experts_down_gemv(mb.act[:k], d.data, d.qtype, ids, weights, h, h, shared=mb.shared, shared_logit=slogit,
                      tile=et, part=mb.part[:k], q8=mb.q8_act)


def prefill_ffn(engine, p: str, xn: torch.Tensor, h: torch.Tensor, act: torch.Tensor) -> None:
    """h [n, d] += MoE FFN of the normed chunk xn [n, d] (bf16); act [n, d_ffn_shexp] is scratch."""
    cfg, mat = engine.config, engine.weights.mat
    router, shg = mat[p + "ffn_gate_inp.weight"], mat[p + "ffn_gate_inp_shexp.weight"]
    xf = xn.float()
    logits = xf @ router.data.float().T  # [n, E] fp32, as the reference routes
    gate = torch.sigmoid(xf @ shg.data.float().T)  # [n, 1]
    ids, weights = moe_route(logits, cfg.n_expert_used)
    g, u, d = mat[p + "ffn_gate_exps.weight"], mat[p + "ffn_up_exps.weight"], mat[p + "ffn_down_exps.weight"]
    routed = grouped_experts(xn, ids, weights, g.data, g.qtype, u.data, u.qtype, d.data, d.qtype,
                             cfg.n_expert, cfg.d_ffn_exp, tile=engine.grouped_tile)
    sg, su, sd = mat[p + "ffn_gate_shexp.weight"], mat[p + "ffn_up_shexp.weight"], mat[p + "ffn_down_shexp.weight"]
    qgemm_swiglu(xn, sg.data, sg.qtype, su.data, su.qtype, sg.cols, out=act)
    shared = qgemm(act, sd.data, sd.qtype, sd.cols)
    h += routed + gate * shared


def active_bytes_per_token(weights) -> int:
    """Weight bytes a decode token reads from the expert stacks: k of E experts per stack."""
    cfg = weights.config
    return sum(w.nbytes * cfg.n_expert_used // cfg.n_expert for n, w in weights.mat.items() if n.endswith("_exps.weight"))
