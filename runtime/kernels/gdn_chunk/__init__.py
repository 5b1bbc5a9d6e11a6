from .kernel import GDNScratch, gdn_chunk
from .naive import gdn_chunk_naive

__all__ = ["gdn_chunk", "gdn_chunk_naive", "GDNScratch"]
