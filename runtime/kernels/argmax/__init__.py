from .kernel import ArgmaxWorkspace, argmax_to
from .naive import argmax_to_naive

__all__ = ["ArgmaxWorkspace", "argmax_to", "argmax_to_naive"]
