"""Dequantizers and quantizers for the ggml types the runtime supports."""


def dequantize(qt, device="cpu"):
    """Placeholder until runtime.quant.dequant lands: gguf's numpy dequantizer."""
    import gguf.quants
    import numpy as np
    import torch

    arr = gguf.quants.dequantize(np.asarray(qt.data), int(qt.type))
    return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32)).reshape(qt.shape).to(device)
