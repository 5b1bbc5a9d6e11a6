"""The tensor names and shapes a qwen35 / qwen35moe model consists of (architecture reference §8.3, §13).

MoE names and layouts are llama.cpp's (src/llama-arch.cpp, qwen35moe load_arch_tensors): the routed
experts are 3-D stacks, torch order [n_expert, out, in] (GGUF ne {in, out, n_expert}).
"""
from __future__ import annotations

from ..config import ModelConfig


def expected_tensors(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """name -> shape in torch order ([out, in] for matrices), in file order."""
    d, c = cfg.d_model, cfg
    out: dict[str, tuple[int, ...]] = {"token_embd.weight": (c.vocab_size, d), "output_norm.weight": (d,)}
    if not cfg.tied_embeddings:
        out["output.weight"] = (c.vocab_size, d)
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        out[p + "attn_norm.weight"] = (d,)
        if cfg.is_attention(i):
            out[p + "attn_q.weight"] = (c.q_proj_dim, d)
            out[p + "attn_k.weight"] = (c.kv_proj_dim, d)
            out[p + "attn_v.weight"] = (c.kv_proj_dim, d)
            out[p + "attn_output.weight"] = (d, c.n_head * c.head_dim)
            out[p + "attn_q_norm.weight"] = (c.head_dim,)
            out[p + "attn_k_norm.weight"] = (c.head_dim,)
        else:
            out[p + "attn_qkv.weight"] = (c.conv_channels, d)
            out[p + "attn_gate.weight"] = (c.value_dim, d)
            out[p + "ssm_beta.weight"] = (c.n_v_head, d)
            out[p + "ssm_alpha.weight"] = (c.n_v_head, d)
            out[p + "ssm_conv1d.weight"] = (c.conv_channels, c.conv_kernel)
            out[p + "ssm_dt.bias"] = (c.n_v_head,)
            out[p + "ssm_a"] = (c.n_v_head,)
            out[p + "ssm_norm.weight"] = (c.ssm_head_dim,)
            out[p + "ssm_out.weight"] = (d, c.value_dim)
        out[p + "post_attention_norm.weight"] = (d,)
        if cfg.is_moe:
            out.update(moe_tensors(cfg, i))
        else:
            out[p + "ffn_gate.weight"] = (c.d_ffn, d)
            out[p + "ffn_up.weight"] = (c.d_ffn, d)
            out[p + "ffn_down.weight"] = (d, c.d_ffn)
    return out


def moe_tensors(cfg: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """Layer i's MoE FFN: router, stacked routed experts, shared expert and its scalar gate."""
    d, e, fe, fs, p = cfg.d_model, cfg.n_expert, cfg.d_ffn_exp, cfg.d_ffn_shexp, f"blk.{i}."
    return {
        p + "ffn_gate_inp.weight": (e, d),  # router logits
        p + "ffn_gate_exps.weight": (e, fe, d),
        p + "ffn_up_exps.weight": (e, fe, d),
        p + "ffn_down_exps.weight": (e, d, fe),
        p + "ffn_gate_inp_shexp.weight": (d,),  # one logit per token; llama.cpp also accepts [1, d]
        p + "ffn_gate_shexp.weight": (fs, d),
        p + "ffn_up_shexp.weight": (fs, d),
        p + "ffn_down_shexp.weight": (d, fs),
    }
