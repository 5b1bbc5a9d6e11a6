from .kernel import gdn_conv
from .naive import gdn_conv_naive

__all__ = ["gdn_conv", "gdn_conv_naive"]
