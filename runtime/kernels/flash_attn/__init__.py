from .kernel import flash_attn
from .naive import flash_attn_naive

__all__ = ["flash_attn", "flash_attn_naive"]
