"""How a chunk of fp32 rows becomes the raw bytes of its ggml type."""
from __future__ import annotations

import numpy as np
import torch

from ..gguf.types import GGMLType


def quantize_rows(x: torch.Tensor, ttype: GGMLType, device: str = "cpu", chunk_weights: int | None = None) -> np.ndarray:
    """fp32 rows [n, cols] → the raw bytes of `ttype` as a numpy array.

    `chunk_weights` caps the weights the quantizer works on at once (its default if None)."""
    if ttype == GGMLType.F32:
        return x.contiguous().numpy()
    if ttype == GGMLType.F16:
        return x.half().numpy()
    if ttype == GGMLType.BF16:
        return x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    try:
        from ..quant.quantize import quantize
    except ImportError:
        quantize = None
    if quantize is not None:
        out = quantize(x.to(device), ttype, chunk_weights=chunk_weights)
        return out.cpu().numpy() if isinstance(out, torch.Tensor) else np.asarray(out)
    if ttype == GGMLType.Q8_0:  # until runtime.quant.quantize lands
        import gguf.quants

        return gguf.quants.quantize(x.numpy(), gguf.GGMLQuantizationType.Q8_0)
    raise RuntimeError(f"no quantizer for {ttype.name}: runtime.quant.quantize is not available")
