from .kernel import AutoTile, GemvConfig, gemv
from .naive import gemv_naive

__all__ = ["AutoTile", "GemvConfig", "gemv", "gemv_naive"]
