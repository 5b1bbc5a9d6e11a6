from .kernel import Q8Vector, quantize_x
from .naive import dequantize_q8, quantize_x_naive

__all__ = ["Q8Vector", "dequantize_q8", "quantize_x", "quantize_x_naive"]
