from .kernel import AttnConfig, AttnWorkspace, attention_decode, default_n_split
from .naive import attention_decode_naive, rope_half_split

__all__ = ["AttnConfig", "AttnWorkspace", "attention_decode", "attention_decode_naive", "default_n_split",
           "rope_half_split"]
