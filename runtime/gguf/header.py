"""A GGUF header (metadata and tensor table) parsed in one pass over the mapped bytes.

Why not `gguf.GGUFReader`: it builds numpy views for every string of the tokenizer arrays
(~500k for the Qwen3.5 vocabulary), which took 30 s of a 32 s model load on the H200
(bench/runtime/load_profile.py). Here strings are decoded straight from the buffer: well under a second.
Little-endian GGUF v2/v3 only (the caller refuses others first).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np


class HeaderError(ValueError):
    """The header or tensor table cannot be parsed (truncated or corrupt)."""


# GGUF metadata value types -> struct format of one scalar.
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
STRING, ARRAY = 8, 9
DEFAULT_ALIGNMENT = 32


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_id: int
    dims: tuple[int, ...]  # GGUF order: ne[0] (the row length) first
    offset: int  # from the start of the data section


@dataclass(frozen=True)
class Header:
    version: int
    metadata: dict[str, object]
    tensors: list[TensorInfo]
    data_start: int  # absolute file offset of the data section (aligned)


class _Cursor:
    def __init__(self, buf):
        self.buf, self.pos, self.end = buf, 0, len(buf)

    def take(self, fmt: str):
        size = struct.calcsize("<" + fmt)
        if self.pos + size > self.end:
            raise HeaderError(f"header ends at byte {self.end} while reading at {self.pos}")
        v = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += size
        return v[0] if len(v) == 1 else v

    def string(self) -> str:
        n = self.take("Q")
        if self.pos + n > self.end:
            raise HeaderError(f"a string of {n} bytes at {self.pos} runs past the end ({self.end})")
        s = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8", "replace")
        self.pos += n
        return s

    def value(self, vtype: int):
        if vtype == STRING:
            return self.string()
        if vtype in _SCALAR:
            return self.take(_SCALAR[vtype])
        if vtype == ARRAY:
            itype, n = self.take("I"), self.take("Q")
            if itype == STRING:
                return [self.string() for _ in range(n)]
            if itype in _NUMPY:
                dt = np.dtype(_NUMPY[itype])
                if self.pos + n * dt.itemsize > self.end:
                    raise HeaderError(f"an array of {n} values at {self.pos} runs past the end ({self.end})")
                arr = np.frombuffer(self.buf, dtype=dt, count=n, offset=self.pos)
                self.pos += n * dt.itemsize
                return arr.tolist()
            if itype == ARRAY:
                return [self.value(ARRAY) for _ in range(n)]
            raise HeaderError(f"array of unknown value type {itype}")
        raise HeaderError(f"unknown metadata value type {vtype}")


def read_header(buf) -> Header:
    """Parse a little-endian GGUF header from a bytes-like buffer (e.g. a numpy memmap)."""
    c = _Cursor(memoryview(buf).cast("B"))
    if bytes(c.buf[:4]) != b"GGUF":
        raise HeaderError("GGUF magic invalid")
    c.pos = 4
    version = c.take("I")
    n_tensors, n_kv = c.take("Q"), c.take("Q")
    meta: dict[str, object] = {}
    for _ in range(n_kv):
        key = c.string()
        meta[key] = c.value(c.take("I"))
    tensors, seen = [], set()
    for _ in range(n_tensors):
        name = c.string()
        if name in seen:
            raise HeaderError(f"duplicated tensor {name!r}")
        seen.add(name)
        n_dims = c.take("I")
        if n_dims > 8:
            raise HeaderError(f"tensor {name!r} has {n_dims} dimensions")
        dims = tuple(c.take("Q") for _ in range(n_dims))
        tensors.append(TensorInfo(name, c.take("I"), dims, c.take("Q")))
    align = meta.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(align, int) or isinstance(align, bool) or align <= 0 or align & (align - 1):
        raise HeaderError(f"general.alignment {align!r} is not a positive power of two")
    start = -(-c.pos // align) * align
    return Header(version, meta, tensors, start)
