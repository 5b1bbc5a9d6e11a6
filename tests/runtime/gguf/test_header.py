"""runtime/gguf/header.py reads what gguf's own writer writes, value for value, and refuses cut headers."""
import gguf
import numpy as np
import pytest

from runtime.gguf.header import HeaderError, read_header


def _write(path, *, alignment=None):
    w = gguf.GGUFWriter(str(path), arch="qwen35")
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_uint32("a.u32", 7)
    w.add_int64("a.i64", -5)
    w.add_float32("a.f32", 0.25)
    w.add_bool("a.bool", True)
    w.add_string("a.str", "héllo")
    w.add_array("a.tokens", [f"tok{i}" for i in range(1000)] + ["", "ü"])
    w.add_array("a.ints", list(range(-3, 300)))
    w.add_array("a.floats", [0.5, 1.5])
    w.add_tensor("t.f32", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.add_tensor("t.u8", np.zeros((2, 34), dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return path


@pytest.mark.parametrize("alignment", [None, 64])
def test_same_values_as_gguf_reader(tmp_path, alignment):
    path = _write(tmp_path / "m.gguf", alignment=alignment)
    ours = read_header(np.memmap(path, mode="r"))
    theirs = gguf.GGUFReader(str(path))
    want = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert ours.metadata == want
    assert ours.data_start == theirs.data_offset
    assert [(t.name, t.type_id, t.dims) for t in ours.tensors] == [
        (t.name, int(t.tensor_type), tuple(int(x) for x in t.shape)) for t in theirs.tensors]
    assert [ours.data_start + t.offset for t in ours.tensors] == [t.data_offset for t in theirs.tensors]


def test_cut_header_is_an_error_not_a_crash(tmp_path):
    raw = _write(tmp_path / "m.gguf").read_bytes()
    for n in (30, 200, 2000, 9000):
        with pytest.raises(HeaderError):
            read_header(raw[:n])


def test_bad_alignment(tmp_path):
    path = _write(tmp_path / "m.gguf", alignment=64)
    raw = bytearray(path.read_bytes())
    i = raw.index(b"general.alignment") + len(b"general.alignment") + 4  # after the value type
    raw[i:i + 4] = (48).to_bytes(4, "little")
    with pytest.raises(HeaderError, match="power of two"):
        read_header(bytes(raw))
