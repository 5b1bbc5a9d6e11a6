from .kernel import qgemm, qgemm_swiglu
from .naive import dequantize_rows, qgemm_naive, qgemm_swiglu_naive

__all__ = ["qgemm", "qgemm_swiglu", "qgemm_naive", "qgemm_swiglu_naive", "dequantize_rows"]
