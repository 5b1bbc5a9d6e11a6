from .kernel import rmsnorm
from .naive import rmsnorm_naive

__all__ = ["rmsnorm", "rmsnorm_naive"]
