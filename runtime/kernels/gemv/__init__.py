from .kernel import AutoTile, GemvConfig, TileTable, gemv, tile_key
from .naive import gemv_naive

__all__ = ["AutoTile", "GemvConfig", "TileTable", "gemv", "gemv_naive", "tile_key"]
