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


# Rows per step of the float64 arithmetic. Whole blocks kept every float64 temporary of a long prompt's
# ~1000 scored rows (2 GB each at a 248k vocabulary) in the worker's own CUDA cache: ~17 GB held through
# the verify phase, where the 9B's fp32 reference then ran out of memory on an 80 GB card
# (bench/receipts/gpu-e2e-h100-20261206T172010Z.json). A step of 64 rows needs ~130 MB per temporary.
CHUNK_ROWS = 64


def _spans(n: int, rows: int):
    for a in range(0, n, rows):
        yield a, min(n, a + rows)


class Reference:
    """One prompt's pinned reference log-probabilities (float32 as cached), ready to compare against."""

    def __init__(self, ref_lp: np.ndarray, device: torch.device, chunk_rows: int = CHUNK_ROWS):
        self.lp = torch.from_numpy(np.ascontiguousarray(ref_lp)).to(device)  # float32; widened per step
        self.top = self.lp.argmax(dim=-1)
        self.device, self.chunk_rows = device, chunk_rows

    def compare(self, logits) -> tuple[float, float, float]:
        """(top-1 agreement, mean KL(ref || rev), max KL) over the prompt's positions, in float64."""
        lg = logits if isinstance(logits, torch.Tensor) else as_tensor(logits, self.device)
        lg, lp, top = lg.reshape(-1, lg.shape[-1]), self.lp.reshape(-1, self.lp.shape[-1]), self.top.reshape(-1)
        agree, kl_sum, kl_max = 0, 0.0, 0.0
        for a, b in _spans(lg.shape[0], self.chunk_rows):
            x, ref = lg[a:b].double(), lp[a:b].double()
            kl = (ref.exp() * (ref - torch.log_softmax(x, dim=-1))).sum(dim=-1).clamp_min(0.0)
            agree += int((x.argmax(dim=-1) == top[a:b]).sum())
            kl_sum, kl_max = kl_sum + float(kl.sum()), max(kl_max, float(kl.max()))
        n = lg.shape[0]
        return agree / n, kl_sum / n, kl_max


def as_tensor(logits: np.ndarray, device: torch.device) -> torch.Tensor:
    """A revision's float32 logits on the scoring device (widened to float64 a step at a time)."""
    return torch.from_numpy(np.ascontiguousarray(logits)).to(device)


def defect(t: torch.Tensor) -> str | None:
    """'nonfinite' / 'constant' when a revision's logits cannot be scored, else None (on the device)."""
    if not bool(torch.isfinite(t).all()):
        return "nonfinite"
    if bool((t == t[..., :1]).all()):
        return "constant"
    return None


def log_softmax(logits: np.ndarray, device: torch.device, chunk_rows: int = CHUNK_ROWS) -> np.ndarray:
    """float64 log-softmax, returned as float32 (the reference cache's type)."""
    x = np.ascontiguousarray(logits)
    rows = x.reshape(-1, x.shape[-1])
    out = np.empty(rows.shape, dtype=np.float32)
    for a, b in _spans(rows.shape[0], chunk_rows):
        step = torch.from_numpy(rows[a:b]).to(device, torch.float64)
        out[a:b] = torch.log_softmax(step, dim=-1).float().cpu().numpy()
    return out.reshape(x.shape)


def release(device: torch.device) -> None:
    """Hand the scoring's cached GPU blocks back to the driver: the revisions and the reference need them next."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
