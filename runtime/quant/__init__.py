"""Dequantizers and quantizers for the ggml types the runtime supports."""
from .dequant import dequantize, dequantize_bytes
from .quantize import quantize

__all__ = ["dequantize", "dequantize_bytes", "quantize"]
