"""Seeded random fp32 weights for any ModelConfig, in memory (GGUF names, torch order).

For tests of the reference and of kernels at small shapes without writing a file. The
values are scaled so activations stay O(1) through the stack and the GDN gates land in
their working ranges (g < 0, beta in (0, 1)); they are not trained weights.
"""
from __future__ import annotations

import math

import torch

from ..config import ModelConfig
from ..gguf.names import expected_tensors


def random_weights(cfg: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def normal(shape, std):
        return torch.randn(shape, generator=gen) * std

    def uniform(shape, lo, hi):
        return lo + (hi - lo) * torch.rand(shape, generator=gen)

    out: dict[str, torch.Tensor] = {}
    for name, shape in expected_tensors(cfg).items():
        if name == "token_embd.weight":
            t = normal(shape, 1.0)
        elif name.endswith("norm.weight") and not name.endswith("ssm_norm.weight"):
            t = 1.0 + normal(shape, 0.1)  # GGUF norms hold the effective multiplier 1 + w
        elif name.endswith("ssm_norm.weight"):
            t = 1.0 + normal(shape, 0.1)
        elif name.endswith("ssm_conv1d.weight"):
            t = normal(shape, 0.5)
        elif name.endswith("ssm_a"):
            t = -torch.exp(uniform(shape, math.log(0.05), math.log(8.0)))  # -exp(A_log)
        elif name.endswith("ssm_dt.bias"):
            t = normal(shape, 1.0)
        else:  # projection [out, in]
            t = normal(shape, 1.0 / math.sqrt(shape[-1]))
        out[name] = t.float()
    return out


def small_config(**overrides) -> ModelConfig:
    """A fast test shape: 3 GDN + 1 attention layer, R = Hv/Hk = 2, G = Hq/Hkv = 2, untied head."""
    base = dict(
        n_layers=4, d_model=64, d_ffn=128, vocab_size=256, n_head=4, n_kv_head=2, n_k_head=2, n_v_head=4,
        head_dim=32, ssm_head_dim=16, rope_dims=16, tied_embeddings=False, context_length=4096, name="small-random",
    )
    return ModelConfig(**{**base, **overrides})
