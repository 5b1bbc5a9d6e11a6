"""The accuracy guards' arithmetic (log-softmax, top-1 agreement, KL) on the worker's own device.

A [256, 248320] logits block is 63.5 M values; numpy's single-threaded float64 log-softmax and KL
took ~20 s per prompt per revision on a 2-core box, the bulk of the accuracy phase. The same
float64 formulas in torch run in milliseconds on the GPU (the worker's own CUDA context, never a
revision's) and multi-threaded on a CPU worker.
"""
from __future__ import annotations

import numpy as np
import torch


def score_device(profile_device: str) -> torch.device:
    if profile_device.startswith("cuda") and torch.cuda.is_available():
        return torch.device(profile_device)
    return torch.device("cpu")


class Reference:
    """One prompt's pinned reference log-probabilities (float32 as cached), ready to compare against."""

    def __init__(self, ref_lp: np.ndarray, device: torch.device):
        self.lp = torch.from_numpy(np.ascontiguousarray(ref_lp)).to(device, torch.float64)
        self.p = self.lp.exp()
        self.top = self.lp.argmax(dim=-1)
        self.device = device

    def compare(self, logits) -> tuple[float, float, float]:
        """(top-1 agreement, mean KL(ref || rev), max KL) over the prompt's positions."""
        lg = logits if isinstance(logits, torch.Tensor) else as_tensor(logits, self.device)
        lsm = torch.log_softmax(lg, dim=-1)
        kl = (self.p * (self.lp - lsm)).sum(dim=-1).clamp_min(0.0)
        top1 = (lg.argmax(dim=-1) == self.top).double().mean()
        return float(top1), float(kl.mean()), float(kl.max())


def as_tensor(logits: np.ndarray, device: torch.device) -> torch.Tensor:
    """A revision's float32 logits on the scoring device as float64 (moved as float32, widened there)."""
    return torch.from_numpy(np.ascontiguousarray(logits)).to(device).double()


def defect(t: torch.Tensor) -> str | None:
    """'nonfinite' / 'constant' when a revision's logits cannot be scored, else None (on the device)."""
    if not bool(torch.isfinite(t).all()):
        return "nonfinite"
    if bool((t == t[..., :1]).all()):
        return "constant"
    return None


def log_softmax(logits: np.ndarray, device: torch.device) -> np.ndarray:
    """float64 log-softmax, returned as float32 (the reference cache's type)."""
    x = torch.from_numpy(np.ascontiguousarray(logits)).to(device, torch.float64)
    return torch.log_softmax(x, dim=-1).float().cpu().numpy()
