from .kernel import attn_prep
from .naive import attn_prep_naive, rope_tables

__all__ = ["attn_prep", "attn_prep_naive", "rope_tables"]
