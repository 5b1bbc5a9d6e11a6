"""Routed-expert GEMV (decode) and grouped GEMM (prefill) from GGUF blocks (kernel.py), torch twins (naive.py)."""
from .kernel import (DEFAULT_EXPERT_TILE, ExpertSort, ExpertTile, GroupedTile, default_expert_tile, experts_down_gemv,
                     experts_swiglu_gemv, grouped_experts, sort_by_expert)
from .naive import experts_down_gemv_naive, experts_swiglu_gemv_naive, grouped_experts_naive

__all__ = ["DEFAULT_EXPERT_TILE", "ExpertSort", "ExpertTile", "GroupedTile", "default_expert_tile", "experts_down_gemv",
           "experts_swiglu_gemv", "grouped_experts", "sort_by_expert",
           "experts_down_gemv_naive", "experts_swiglu_gemv_naive", "grouped_experts_naive"]
