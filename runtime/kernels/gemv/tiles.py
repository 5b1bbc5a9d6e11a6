"""The engine's default GEMV tiles: measured ones per launch shape where we have them.

tiles_sm90.json holds, for Hopper (sm_90), the fastest correct tile of each decode launch shape
of the 4B and 9B models (bench/profiling/gemv_sweep.py on an H200) and a fallback heuristic for every
other shape. Other GPUs get the byte-wise heuristic; the CPU interpreter its own small config.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import torch

from .kernel import AutoTile, TileTable

TILES_SM90 = Path(__file__).with_name("tiles_sm90.json")


@lru_cache(maxsize=None)
def sm90_table() -> TileTable:
    doc = json.loads(TILES_SM90.read_text())
    return TileTable.from_dict(doc["tiles"], AutoTile(**doc["fallback"]))


def default_config(device) -> TileTable | AutoTile:
    """The GEMV config the engine uses on `device` unless told otherwise."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0):
        return sm90_table()
    return AutoTile()
