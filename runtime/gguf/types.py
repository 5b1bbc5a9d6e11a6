"""ggml tensor types the runtime reads, with their block geometry."""
from __future__ import annotations

from enum import IntEnum
from math import prod


class GGMLType(IntEnum):
    F32 = 0
    F16 = 1
    Q8_0 = 8
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    BF16 = 30


# (weights per block, bytes per block), as ggml-common.h defines them.
BLOCK: dict[GGMLType, tuple[int, int]] = {
    GGMLType.F32: (1, 4),
    GGMLType.F16: (1, 2),
    GGMLType.BF16: (1, 2),
    GGMLType.Q8_0: (32, 34),
    GGMLType.Q4_K: (256, 144),
    GGMLType.Q5_K: (256, 176),
    GGMLType.Q6_K: (256, 210),
}
SUPPORTED_TYPES = frozenset(BLOCK)


def tensor_nbytes(ttype: GGMLType, shape: tuple[int, ...]) -> int:
    """Bytes a tensor of `shape` (torch order; rows are the last dim) takes in `ttype`."""
    per_block, nbytes = BLOCK[ttype]
    row = shape[-1]
    if row % per_block:
        raise ValueError(f"row length {row} is not a multiple of the {ttype.name} block size {per_block}")
    return prod(shape[:-1]) * (row // per_block) * nbytes
