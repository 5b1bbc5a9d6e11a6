"""Stream a GGUF file tensor by tensor with `gguf.GGUFWriter`.

The header (metadata + every tensor info) is written first from a plan; then each tensor's
bytes are produced, written and dropped, so a 27B model never sits in memory.  The bytes are
a pure function of the inputs: keys are written in the order given, no timestamps.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .types import GGMLType


@dataclass(frozen=True)
class MetaValue:
    """One metadata key/value with its explicit GGUF value type (no type guessing)."""

    key: str
    value: object
    vtype: str  # a gguf.GGUFValueType name: "UINT32", "FLOAT32", "STRING", "BOOL", "ARRAY", ...
    sub_type: str | None = None  # element type for arrays


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # torch order (rows last), as GGUFModel reports it
    type: GGMLType
    nbytes: int


def _writer(path: Path, arch: str, metadata: Sequence[MetaValue], alignment: int):
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    if alignment != gguf.GGUF_DEFAULT_ALIGNMENT:
        w.add_custom_alignment(alignment)
    for m in metadata:
        if m.key == "general.architecture":
            continue  # GGUFWriter writes it from `arch`
        sub = gguf.GGUFValueType[m.sub_type] if m.sub_type else None
        w.add_key_value(m.key, m.value, gguf.GGUFValueType[m.vtype], sub)
    return w


def write_gguf(
    path: str | os.PathLike,
    arch: str,
    metadata: Sequence[MetaValue],
    tensors: Sequence[TensorSpec],
    produce: Callable[[TensorSpec], Iterable[np.ndarray]],
    *,
    alignment: int = 32,
    on_tensor: Callable[[TensorSpec], None] | None = None,
) -> Path:
    """Write `path`. `produce(spec)` yields the tensor's raw bytes in one or more pieces
    (any numpy dtype; their total size must equal spec.nbytes); pieces are written as they come.
    """
    import gguf

    path = Path(path)
    w = _writer(path, arch, metadata, alignment)
    for t in tensors:
        # Logical (element) shape; dtype placeholder + raw_dtype keeps the shape as given.
        w.add_tensor_info(t.name, list(t.shape), np.dtype(np.float32), t.nbytes, raw_dtype=gguf.GGMLQuantizationType(int(t.type)))
    tmp = path.with_name(path.name + ".partial")
    try:
        w.write_header_to_file(tmp)
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        fout = w.fout[0]
        w.write_padding(fout, fout.tell())
        for t in tensors:
            written = 0
            for piece in produce(t):
                piece = np.ascontiguousarray(piece)
                written += piece.nbytes
                if written > t.nbytes:
                    raise ValueError(f"{t.name}: producer gave more than the planned {t.nbytes} bytes")
                piece.tofile(fout)
            if written != t.nbytes:
                raise ValueError(f"{t.name}: producer gave {written} bytes, planned {t.nbytes}")
            w.write_padding(fout, fout.tell())
            if on_tensor is not None:
                on_tensor(t)
        w.close()
        os.replace(tmp, path)
    except BaseException:
        w.close()
        tmp.unlink(missing_ok=True)
        raise
    return path


def header_nbytes(arch: str, metadata: Sequence[MetaValue], tensors: Sequence[TensorSpec], alignment: int = 32) -> int:
    """Bytes before the first tensor's data (header + metadata + tensor infos + padding), computed
    without touching the disk, so a file's size can be predicted exactly from its plan."""
    import io

    import gguf

    w = _writer(Path("unused.gguf"), arch, metadata, alignment)
    for t in tensors:
        w.add_tensor_info(t.name, list(t.shape), np.dtype(np.float32), t.nbytes, raw_dtype=gguf.GGMLQuantizationType(int(t.type)))
    buf = io.BytesIO()
    w.fout = [buf]
    w.state = gguf.gguf_writer.WriterState.EMPTY
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    n = buf.tell()
    return n + (-n) % alignment


def planned_file_nbytes(arch: str, metadata: Sequence[MetaValue], tensors: Sequence[TensorSpec], alignment: int = 32) -> int:
    data = sum(t.nbytes + (-t.nbytes) % alignment for t in tensors)
    return header_nbytes(arch, metadata, tensors, alignment) + data


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
