"""Qwen3.5 (`qwen35`, and the MoE sibling `qwen35moe`) fp32 reference forward in pure torch, in forward order.

This is the model every other backend is measured against (docs/protocol.md), so it
favours plain maths over speed. Section numbers refer to the architecture reference
(shared/docs/qwen35-architecture.md). Shapes: T = tokens in this call, d = d_model,
Cc/Ck/Cv = GDN conv/key/value widths, Hq/Hkv/Dh = attention heads and head dim,
Hk/Hv/dk/dv = GDN heads and head dims.

Weights are a dict of fp32 tensors keyed by GGUF tensor name (torch order, [out, in]);
a GGUF file is one source of that dict (`weights_from_gguf`), an in-memory synthetic
model is another. GGUF norm weights are already the effective multipliers (1 + w).
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..gguf import GGUFModel, load_gguf
from ..gguf.names import expected_tensors
from .attention_ref import apply_rope_ref, attention_ref, rms_norm_ref, rope_cos_sin
from .moe_ref import moe_ffn_ref
from .deltanet_ref import (
    causal_conv1d_ref,
    gated_delta_rule_chunked,
    gated_delta_rule_recurrent,
    gated_rms_norm_ref,
    gdn_gates,
    l2_normalize,
)

GDN_MODES = ("auto", "chunked", "recurrent")


# -- 1. weights -------------------------------------------------------------------------


def weights_from_gguf(model: GGUFModel | str | os.PathLike, device="cpu") -> dict[str, torch.Tensor]:
    """Dequantize every tensor of a qwen35 GGUF to fp32 (any supported ggml type)."""
    if not isinstance(model, GGUFModel):
        model = load_gguf(model)
    return {name: qt.dequantize(device=device) for name, qt in model.tensors.items()}


class WeightsOnUse(Mapping):
    """fp32 weights made each time one is read and dropped after its use, never held together.

    For a reference whose resident fp32 copy would not fit beside the engine (the 27B's is 108 GB, the 9B's
    36 GB next to 32k positions of logits): each forward pays one dequantization per tensor instead.
    `make(name)` returns that tensor's values; shapes are name -> torch shape, checked on every read.
    """

    def __init__(self, shapes: Mapping[str, tuple[int, ...]], make: Callable[[str], torch.Tensor], device="cpu"):
        self.shapes = {k: tuple(v) for k, v in shapes.items()}
        self.make, self.device = make, torch.device(device)

    def __getitem__(self, name: str) -> torch.Tensor:
        want = self.shapes[name]  # KeyError for a name it does not have, like a dict
        t = self.make(name)
        if t.numel() != math.prod(want):
            raise ValueError(f"weights: {name!r} made {t.numel()} values, its shape {list(want)} holds {math.prod(want)}")
        return t.to(device=self.device, dtype=torch.float32).reshape(want).contiguous()

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)

    def on(self, device) -> "WeightsOnUse":
        return WeightsOnUse(self.shapes, self.make, device)


def check_weights(cfg: ModelConfig, tensors: Mapping[str, torch.Tensor], device="cpu") -> Mapping[str, torch.Tensor]:
    """The tensors the config needs, fp32 and contiguous on `device`; ValueError if any is missing or misshapen.

    WeightsOnUse is checked by its declared shapes (reading it would make every tensor) and kept as it is.
    """
    if isinstance(tensors, WeightsOnUse):
        for name, want in expected_tensors(cfg).items():
            if tensors.shapes.get(name) != want:
                raise ValueError(f"weights: tensor {name!r} declared {tensors.shapes.get(name)}, expected {list(want)}")
        return tensors.on(device)
    out = {}
    for name, want in expected_tensors(cfg).items():
        t = tensors.get(name)
        if t is None:
            raise ValueError(f"weights: missing tensor {name!r} (shape {list(want)})")
        if tuple(t.shape) != want:
            raise ValueError(f"weights: tensor {name!r} has shape {list(t.shape)}, expected {list(want)}")
        out[name] = t.to(device=device, dtype=torch.float32).contiguous()
    return out


# -- 2. per-sequence state (§9.1) -----------------------------------------------------------


@dataclass
class Qwen35State:
    """Everything one sequence carries between calls.

    conv[i]  [Kc-1, Cc]      last raw qkv projections of GDN layer i, oldest first
    ssm[i]   [Hv, dk, dv]    recurrent state S of GDN layer i (fp32)
    k[i], v[i] [cap, Hkv, Dh] KV cache of attention layer i (k after norm + RoPE); rows < position valid
    """

    conv: list[torch.Tensor]
    ssm: list[torch.Tensor]
    k: list[torch.Tensor]
    v: list[torch.Tensor]
    position: int = 0
    last_logits: torch.Tensor | None = field(default=None, repr=False)

    @classmethod
    def empty(cls, cfg: ModelConfig, device="cpu", kv_capacity: int = 256) -> "Qwen35State":
        n_gdn, n_attn = len(cfg.deltanet_layers), len(cfg.attention_layers)
        f32 = dict(dtype=torch.float32, device=device)
        kv_shape = (kv_capacity, cfg.n_kv_head, cfg.head_dim)
        return cls(
            conv=[torch.zeros(cfg.conv_kernel - 1, cfg.conv_channels, **f32) for _ in range(n_gdn)],
            ssm=[torch.zeros(cfg.n_v_head, cfg.ssm_head_dim, cfg.ssm_head_dim, **f32) for _ in range(n_gdn)],
            k=[torch.zeros(kv_shape, **f32) for _ in range(n_attn)],
            v=[torch.zeros(kv_shape, **f32) for _ in range(n_attn)],
        )

    @property
    def kv_capacity(self) -> int:
        return self.k[0].shape[0] if self.k else 0

    def reserve(self, n_positions: int) -> None:
        """Grow the KV buffers (doubling) so that `n_positions` rows fit."""
        cap = self.kv_capacity
        if not self.k or n_positions <= cap:
            return
        new_cap = max(n_positions, 2 * cap)
        for buf in (self.k, self.v):
            for i, t in enumerate(buf):
                grown = t.new_zeros((new_cap, *t.shape[1:]))
                grown[: self.position] = t[: self.position]
                buf[i] = grown

    def reset(self) -> None:
        for t in (*self.conv, *self.ssm):
            t.zero_()
        self.position = 0
        self.last_logits = None

    def snapshot(self) -> dict:
        p = self.position
        return {
            "conv": [t.clone() for t in self.conv],
            "ssm": [t.clone() for t in self.ssm],
            "k": [t[:p].clone() for t in self.k],
            "v": [t[:p].clone() for t in self.v],
            "position": p,
            "last_logits": None if self.last_logits is None else self.last_logits.clone(),
        }

    def restore(self, snap: dict) -> None:
        p = snap["position"]
        for dst, src in zip(self.conv + self.ssm, snap["conv"] + snap["ssm"], strict=True):
            dst.copy_(src)
        self.position = 0  # nothing valid to carry over while growing
        self.reserve(p)
        for dst, src in zip(self.k + self.v, snap["k"] + snap["v"], strict=True):
            dst[:p].copy_(src)
        self.position = p
        self.last_logits = None if snap["last_logits"] is None else snap["last_logits"].clone()

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.conv, *self.ssm, *self.k, *self.v))


# -- 3. the model ------------------------------------------------------------------------------


class Qwen35Reference:
    """fp32 Qwen3.5 forward over one sequence. Stateless itself: the state is passed in."""

    def __init__(self, cfg: ModelConfig, tensors: dict[str, torch.Tensor], device="cpu"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.w = check_weights(cfg, tensors, self.device)
        self.lm_head = self.w["token_embd.weight"] if cfg.tied_embeddings else self.w["output.weight"]
        self.routes: list[torch.Tensor] | None = None  # set to [] to record each MoE layer's top-k ids [T, k]

    @classmethod
    def from_gguf(cls, model: GGUFModel | str | os.PathLike, device="cpu") -> "Qwen35Reference":
        if not isinstance(model, GGUFModel):
            model = load_gguf(model)
        return cls(model.config, weights_from_gguf(model, device), device)

    @property
    def weights_held(self) -> str:
        return "made on use" if isinstance(self.w, WeightsOnUse) else "resident"

    @property
    def weights_bytes(self) -> int:
        """The fp32 weights' size, resident or made on use (read from shapes: reading would make them)."""
        return 4 * sum(math.prod(s) for s in expected_tensors(self.cfg).values())

    def new_state(self, kv_capacity: int = 256) -> Qwen35State:
        return Qwen35State.empty(self.cfg, self.device, kv_capacity)

    # forward: embed -> L x (norm, mixer, residual, norm, FFN, residual) -> norm -> LM head (§3)
    def forward(
        self, token_ids: torch.Tensor, state: Qwen35State, *, all_logits: bool = False, gdn_mode: str = "auto"
    ) -> torch.Tensor:
        """Consume `token_ids` [T] at positions state.position ...; update `state` in place.

        Returns fp32 logits [T, V] if all_logits else [V] (last token). gdn_mode: "chunked"
        (§5.8), "recurrent" (§5.6), or "auto" = chunked when T > 1, recurrent for one token.
        """
        if gdn_mode not in GDN_MODES:
            raise ValueError(f"gdn_mode {gdn_mode!r}; choose one of {GDN_MODES}")
        cfg = self.cfg
        T = token_ids.shape[0]
        chunked = gdn_mode == "chunked" or (gdn_mode == "auto" and T > 1)
        state.reserve(state.position + T)
        positions = torch.arange(state.position, state.position + T, device=self.device)

        rope = rope_cos_sin(positions, cfg.rope_dims, cfg.rope_base)  # §4.3, shared by all attention layers
        h = self.w["token_embd.weight"][token_ids]  # [T, d], no scaling
        i_gdn = i_attn = 0
        for layer in range(cfg.n_layers):
            p = f"blk.{layer}."
            a = rms_norm_ref(h, self.w[p + "attn_norm.weight"], cfg.rms_eps)
            if cfg.is_attention(layer):
                h = h + self._attention(p, a, rope, state, i_attn)
                i_attn += 1
            else:
                h = h + self._gated_deltanet(p, a, state, i_gdn, chunked)
                i_gdn += 1
            f = rms_norm_ref(h, self.w[p + "post_attention_norm.weight"], cfg.rms_eps)  # the pre-FFN norm
            h = h + self._ffn(p, f)
        state.position += T

        if not all_logits:
            h = h[-1:]
        y = rms_norm_ref(h, self.w["output_norm.weight"], cfg.rms_eps)
        logits = F.linear(y, self.lm_head)  # [T or 1, V]
        state.last_logits = logits[-1].clone()
        return logits if all_logits else logits[0]

    __call__ = forward

    # Gated DeltaNet mixer (§5): a [T, d] -> [T, d]
    def _gated_deltanet(self, p: str, a: torch.Tensor, state: Qwen35State, i: int, chunked: bool) -> torch.Tensor:
        cfg, w = self.cfg, self.w
        T, Ck, hk, hv, dk = a.shape[0], cfg.key_dim, cfg.n_k_head, cfg.n_v_head, cfg.ssm_head_dim
        u = F.linear(a, w[p + "attn_qkv.weight"])  # [T, Cc] = q | k | v, head-major in each part
        z = F.linear(a, w[p + "attn_gate.weight"]).view(T, hv, dk)  # [T, Hv, dv] output gate
        b = F.linear(a, w[p + "ssm_beta.weight"])  # [T, Hv]
        alpha = F.linear(a, w[p + "ssm_alpha.weight"])  # [T, Hv]

        # §5.2 causal conv (kernel 4) over q|k|v with the carried raw inputs, then SiLU
        u, state.conv[i] = causal_conv1d_ref(u, w[p + "ssm_conv1d.weight"], state.conv[i])
        q = l2_normalize(u[:, :Ck].view(T, hk, dk))  # §5.3, [T, Hk, dk]
        k = l2_normalize(u[:, Ck : 2 * Ck].view(T, hk, dk))
        v = u[:, 2 * Ck :].view(T, hv, dk)  # [T, Hv, dv], not normalised

        g, beta = gdn_gates(alpha, b, w[p + "ssm_a"], w[p + "ssm_dt.bias"])  # §5.4, [T, Hv] each
        rule = gated_delta_rule_chunked if chunked else gated_delta_rule_recurrent
        o, state.ssm[i] = rule(q, k, v, g, beta, state.ssm[i], scale=dk**-0.5)  # §5.6/§5.8, [T, Hv, dv]

        y = gated_rms_norm_ref(o, z, w[p + "ssm_norm.weight"], cfg.rms_eps)  # §5.7
        return F.linear(y.reshape(T, cfg.value_dim), w[p + "ssm_out.weight"])

    # gated full attention (§4): a [T, d] -> [T, d]
    def _attention(self, p: str, a: torch.Tensor, rope: tuple, state: Qwen35State, i: int) -> torch.Tensor:
        """rope = (cos, sin) [T, rope_dims/2] for this call's positions."""
        cfg, w = self.cfg, self.w
        T, hq, hkv, dh = a.shape[0], cfg.n_head, cfg.n_kv_head, cfg.head_dim
        qg = F.linear(a, w[p + "attn_q.weight"]).view(T, hq, 2 * dh)  # per head [q | gate] (§4.1)
        q, gate = qg[..., :dh], qg[..., dh:]
        k = F.linear(a, w[p + "attn_k.weight"]).view(T, hkv, dh)
        v = F.linear(a, w[p + "attn_v.weight"]).view(T, hkv, dh)

        q = rms_norm_ref(q, w[p + "attn_q_norm.weight"], cfg.rms_eps)  # §4.2, before RoPE
        k = rms_norm_ref(k, w[p + "attn_k_norm.weight"], cfg.rms_eps)
        q, k = apply_rope_ref(q, *rope), apply_rope_ref(k, *rope)  # §4.3, half-split on the first 64 dims

        start, end = state.position, state.position + T  # §4.5: cache post-norm, post-RoPE k and raw v
        state.k[i][start:end] = k
        state.v[i][start:end] = v
        o = attention_ref(q, state.k[i][:end], state.v[i][:end], scale=dh**-0.5)  # §4.4, [T, Hq, Dh]
        o = o * torch.sigmoid(gate)
        return F.linear(o.reshape(T, hq * dh), w[p + "attn_output.weight"])

    # SwiGLU FFN (§6), or the routed + shared experts (§13): f [T, d] -> [T, d]
    def _ffn(self, p: str, f: torch.Tensor) -> torch.Tensor:
        w = self.w
        if self.cfg.is_moe:
            out, ids = moe_ffn_ref(f, w, p, self.cfg.n_expert_used)
            if self.routes is not None:
                self.routes.append(ids)
            return out
        hidden = F.silu(F.linear(f, w[p + "ffn_gate.weight"])) * F.linear(f, w[p + "ffn_up.weight"])  # [T, F]
        return F.linear(hidden, w[p + "ffn_down.weight"])
