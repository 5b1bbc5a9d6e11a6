from .kernel import embed
from .naive import embed_naive

__all__ = ["embed", "embed_naive"]
