"""The streaming GGUF writer: exact bytes back, planned size = real size, determinism, errors."""
import gguf
import numpy as np
import pytest

from runtime.gguf.types import GGMLType
from runtime.gguf.writer import MetaValue, TensorSpec, file_sha256, planned_file_nbytes, write_gguf

META = [
    MetaValue("general.name", "t", "STRING"),
    MetaValue("x.u32", 7, "UINT32"),
    MetaValue("x.f32", 1.5, "FLOAT32"),
    MetaValue("x.arr", [11, 11, 10, 0], "ARRAY", "INT32"),
    MetaValue("x.strs", ["a", "b c"], "ARRAY", "STRING"),
    MetaValue("x.flag", False, "BOOL"),
]


def _tensors():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((6, 32)).astype(np.float32)
    b = rng.standard_normal((5,)).astype(np.float32)
    c = rng.integers(0, 255, (3, 34), dtype=np.uint8)  # raw Q8_0 bytes: 3 rows × one block
    specs = [
        TensorSpec("a", (6, 32), GGMLType.F32, a.nbytes),
        TensorSpec("b", (5,), GGMLType.F32, b.nbytes),
        TensorSpec("c", (3, 32), GGMLType.Q8_0, c.nbytes),
    ]
    data = {"a": a, "b": b, "c": c}
    return specs, data


def _write(path, specs, data):
    def produce(t):  # in row pieces, as the factory streams them
        arr = data[t.name]
        for i in range(0, len(arr), 2):
            yield arr[i : i + 2]

    return write_gguf(path, "qwen35", META, specs, produce)


def test_round_trip_and_planned_size(tmp_path):
    specs, data = _tensors()
    p = _write(tmp_path / "m.gguf", specs, data)
    assert p.stat().st_size == planned_file_nbytes("qwen35", META, specs)
    r = gguf.GGUFReader(p)
    assert r.fields["general.architecture"].contents() == "qwen35"
    assert r.fields["x.u32"].contents() == 7 and r.fields["x.arr"].contents() == [11, 11, 10, 0]
    assert r.fields["x.strs"].contents() == ["a", "b c"] and r.fields["x.flag"].contents() is False
    got = {t.name: t for t in r.tensors}
    assert got["a"].tensor_type == gguf.GGMLQuantizationType.F32 and list(got["a"].shape) == [32, 6]
    np.testing.assert_array_equal(np.asarray(got["a"].data), data["a"])
    np.testing.assert_array_equal(np.asarray(got["b"].data), data["b"])
    assert got["c"].tensor_type == gguf.GGMLQuantizationType.Q8_0
    np.testing.assert_array_equal(np.asarray(got["c"].data).reshape(3, 34), data["c"])
    for t in r.tensors:
        assert t.data_offset % 32 == 0


def test_same_input_same_bytes(tmp_path):
    specs, data = _tensors()
    a = file_sha256(_write(tmp_path / "1.gguf", specs, data))
    b = file_sha256(_write(tmp_path / "2.gguf", specs, data))
    assert a == b


def test_wrong_byte_count_fails_and_leaves_no_file(tmp_path):
    specs, data = _tensors()
    data["b"] = data["b"][:4]
    with pytest.raises(ValueError, match="'?b'?.*16 bytes, planned 20"):
        _write(tmp_path / "bad.gguf", specs, data)
    assert list(tmp_path.iterdir()) == []
