from .kernel import gdn_decode_step
from .naive import gdn_decode_step_naive

__all__ = ["gdn_decode_step", "gdn_decode_step_naive"]
