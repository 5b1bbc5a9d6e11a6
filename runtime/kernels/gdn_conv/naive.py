"""Causal depthwise conv (kernel Kc) + SiLU over a prefill chunk, continuing from the conv state (§5.2, §5.9)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def gdn_conv_naive(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """y [T, C] = SiLU(Σ_i w[:, i] · window[t + i]) with window = [state; x] (tap Kc-1 = current token).

    x [T, C] raw projections; weight [C, Kc]; state [Kc-1, C] fp32, oldest first. Updates
    `state` in place to the last Kc-1 raw inputs and returns y in fp32.
    """
    t, kc = x.shape[0], weight.shape[1]
    window = torch.cat([state.float(), x.float()], dim=0)
    y = sum(window[i : i + t] * weight[:, i].float() for i in range(kc))
    state.copy_(window[window.shape[0] - (kc - 1) :])
    return F.silu(y)
