from .kernel import GemvConfig, gemv
from .naive import gemv_naive

__all__ = ["GemvConfig", "gemv", "gemv_naive"]
