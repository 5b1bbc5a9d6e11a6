"""Dequantizers, quantizers and the per-tensor type policy for the ggml types the runtime supports."""
from .dequant import dequantize, dequantize_bytes
from .policy import MIXES, model_nbytes, q4_k_m_type, tensor_type, tensor_types
from .quantize import quantize

__all__ = [
    "dequantize",
    "dequantize_bytes",
    "quantize",
    "MIXES",
    "q4_k_m_type",
    "tensor_type",
    "tensor_types",
    "model_nbytes",
]
