"""Our torch dequantizers must equal gguf.quants.dequantize bit for bit."""
import os
from pathlib import Path

import gguf.quants
import numpy as np
import pytest
import torch

from runtime.gguf import GGMLType, load_gguf
from runtime.gguf.types import BLOCK
from runtime.quant import dequantize, dequantize_bytes
from tests.paths import TINY

FIXTURE = (TINY / "qwen35-tiny4-Q4_K_M.gguf")

# Byte offsets of the fp16 scale fields inside one block.
F16_FIELDS = {
    GGMLType.Q8_0: [0],
    GGMLType.Q4_K: [0, 2],
    GGMLType.Q5_K: [0, 2],
    GGMLType.Q6_K: [208],
}


def random_blocks(gtype: GGMLType, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes, with every fp16 scale replaced by a random finite fp16 (normal, subnormal or zero)."""
    _, nbytes = BLOCK[gtype]
    raw = rng.integers(0, 256, size=(n_blocks, nbytes), dtype=np.uint8)
    for off in F16_FIELDS.get(gtype, []):
        bits = rng.integers(0, 1 << 16, size=n_blocks, dtype=np.uint16)
        exp_all_ones = (bits & 0x7C00) == 0x7C00
        bits[exp_all_ones] &= 0xBFFF  # clear the top exponent bit: inf/nan -> finite
        raw[:, off : off + 2] = bits.view(np.uint8).reshape(n_blocks, 2)
    if gtype == GGMLType.F16:
        bits = raw.view(np.uint16)
        bits[(bits & 0x7C00) == 0x7C00] &= 0xBFFF
    return raw


def gguf_reference(raw: np.ndarray, gtype: GGMLType, shape) -> np.ndarray:
    return np.asarray(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(int(gtype))), dtype=np.float32).reshape(shape)


def assert_bits_equal(ours: torch.Tensor, ref: np.ndarray):
    assert ours.dtype == torch.float32
    assert tuple(ours.shape) == ref.shape
    a = ours.cpu().numpy().view(np.uint32)
    b = np.ascontiguousarray(ref).view(np.uint32)
    mismatch = np.flatnonzero(a != b)
    assert mismatch.size == 0, f"{mismatch.size} values differ, first at flat index {mismatch[0]}"


@pytest.mark.parametrize("gtype", list(BLOCK))
def test_random_blocks_match_gguf(gtype):
    rng = np.random.default_rng(int(gtype))
    per_block, nbytes = BLOCK[gtype]
    rows, blocks_per_row = 24, 3 if per_block > 1 else 64
    raw = random_blocks(gtype, rows * blocks_per_row, rng).reshape(rows, blocks_per_row * nbytes)
    shape = (rows, blocks_per_row * per_block)
    ref = gguf_reference(raw, gtype, shape)
    assert_bits_equal(dequantize_bytes(raw, gtype, shape), ref)
    # a torch uint8 input and a 3-D shape take the same path
    ours3 = dequantize_bytes(torch.from_numpy(raw.copy()), int(gtype), (2, rows // 2, shape[1]))
    assert_bits_equal(ours3, ref.reshape(2, rows // 2, shape[1]))


def test_q6_k_extreme_codes():
    """All-ones and all-zeros quants with the largest/smallest int8 scales (sign handling of q-32 and scales)."""
    raw = np.zeros((4, 210), dtype=np.uint8)
    raw[0, :192] = 0xFF
    raw[1, :192] = 0x00
    raw[2, :192] = 0xAA
    raw[3, :192] = 0x55
    raw[:, 192:208] = np.array([-128, 127, -1, 0, 1, 64, -64, 5] * 2, dtype=np.int8).view(np.uint8)
    raw[:, 208:210] = np.array([0.125], dtype=np.float16).view(np.uint8)
    assert_bits_equal(dequantize_bytes(raw, GGMLType.Q6_K, (4, 256)), gguf_reference(raw, GGMLType.Q6_K, (4, 256)))


def test_fixture_every_tensor_matches_gguf():
    model = load_gguf(FIXTURE)
    seen = set()
    for name, qt in model.tensors.items():
        seen.add(qt.type)
        ref = gguf_reference(np.asarray(qt.data).view(np.uint8), qt.type, qt.shape)
        ours = dequantize(qt)
        assert_bits_equal(ours, ref)
        assert torch.equal(qt.dequantize(), ours)  # the QTensor convenience method routes here
    assert {GGMLType.F32, GGMLType.Q4_K, GGMLType.Q6_K} <= seen


def test_rejects_wrong_byte_count():
    raw = np.zeros(143, dtype=np.uint8)
    with pytest.raises(ValueError, match="needs 144 bytes, got 143"):
        dequantize_bytes(raw, GGMLType.Q4_K, (1, 256))


def test_rejects_row_not_multiple_of_block():
    with pytest.raises(ValueError, match="not a multiple"):
        dequantize_bytes(np.zeros(144, dtype=np.uint8), GGMLType.Q4_K, (2, 128))


def test_rejects_unsupported_type():
    with pytest.raises(ValueError):
        dequantize_bytes(np.zeros(18, dtype=np.uint8), 2, (1, 32))  # Q4_0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("gtype", list(BLOCK))
def test_cuda_matches_gguf(gtype):
    rng = np.random.default_rng(100 + int(gtype))
    per_block, nbytes = BLOCK[gtype]
    raw = random_blocks(gtype, 64 * 4, rng).reshape(64, 4 * nbytes)
    shape = (64, 4 * per_block)
    out = dequantize_bytes(raw, gtype, shape, device="cuda")
    assert out.is_cuda
    assert_bits_equal(out, gguf_reference(raw, gtype, shape))
