from .gather import dequantize_matrix, gather_rows
from .kernel import qgemm, qgemm_swiglu
from .naive import dequantize_rows, gather_rows_naive, qgemm_naive, qgemm_swiglu_naive

__all__ = ["qgemm", "qgemm_swiglu", "gather_rows", "dequantize_matrix", "qgemm_naive", "qgemm_swiglu_naive", "gather_rows_naive", "dequantize_rows"]
