from .kernel import gated_norm
from .naive import gated_norm_naive

__all__ = ["gated_norm", "gated_norm_naive"]
