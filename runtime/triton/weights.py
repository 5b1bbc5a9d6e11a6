"""Model weights on the device, uploaded once in their GGUF block layout.

Block-quantized matrices (Q4_K, Q5_K, Q6_K, Q8_0) become uint8 [rows, row_bytes] with the
file's bytes unchanged, so the decode GEMV and the prefill GEMM both read one copy and a
27B model fits in its Q4 footprint. F32/F16/BF16 matrices stay typed [rows, cols].
Small 1-D tensors (norms, ssm_a, ssm_dt.bias) and ssm_conv1d [Cc, 4] are fp32.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..gguf import BLOCK, GGMLType, GGUFModel, QTensor

FLOAT_TYPES = {GGMLType.F32: torch.float32, GGMLType.F16: torch.float16, GGMLType.BF16: torch.bfloat16}
BLOCK_TYPES = frozenset({GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.Q8_0})


@dataclass(frozen=True)
class QWeight:
    """One matrix [rows, cols] on the device: raw GGUF blocks, or a typed float tensor."""

    name: str
    qtype: GGMLType
    rows: int
    cols: int
    data: torch.Tensor  # uint8 [rows, row_bytes] for block types, typed [rows, cols] otherwise

    @property
    def row_bytes(self) -> int:
        per_block, nbytes = BLOCK[self.qtype]
        return self.cols // per_block * nbytes

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    @property
    def is_block(self) -> bool:
        return self.qtype in BLOCK_TYPES


def _host_bytes(qt: QTensor) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(qt.data)).view(np.uint8)


def upload_matrix(qt: QTensor, device) -> QWeight:
    """QTensor [rows, cols] -> QWeight on `device` (one host-to-device copy, no dequantization)."""
    if len(qt.shape) != 2:
        raise ValueError(f"{qt.name}: expected a matrix, got shape {list(qt.shape)}")
    rows, cols = qt.shape
    host = _host_bytes(qt)
    if torch.device(device).type == "cpu" or not host.flags.writeable:
        host = host.copy()  # never alias a read-only memmap from a torch tensor
    raw = torch.from_numpy(host)
    if qt.type in BLOCK_TYPES:
        per_block, nbytes = BLOCK[qt.type]
        data = raw.reshape(rows, cols // per_block * nbytes)
    elif qt.type in FLOAT_TYPES:
        data = raw.view(FLOAT_TYPES[qt.type]).reshape(rows, cols)
    else:
        raise ValueError(f"{qt.name}: unsupported tensor type {qt.type!r}")
    return QWeight(qt.name, GGMLType(qt.type), rows, cols, data.to(device).contiguous())


def qweight_from_host(name: str, qtype: GGMLType, rows: int, cols: int, raw: np.ndarray, device) -> QWeight:
    """Build a QWeight from host bytes (tests, synthetic weights)."""
    qt = QTensor(name, GGMLType(qtype), (rows, cols), raw)
    return upload_matrix(qt, device)


def dequantize_qweight(w: QWeight) -> torch.Tensor:
    """fp32 [rows, cols] on the weight's device, via runtime.quant (the naive path)."""
    from ..quant import dequantize

    if not w.is_block:
        return w.data.float()
    host = w.data.detach().cpu().contiguous().numpy()
    return dequantize(QTensor(w.name, w.qtype, (w.rows, w.cols), host)).reshape(w.rows, w.cols).to(w.data.device)


def _vector(qt: QTensor, device) -> torch.Tensor:
    from ..quant import dequantize

    if qt.type == GGMLType.F32:
        t = torch.from_numpy(np.array(qt.data, dtype=np.float32)).reshape(qt.shape)  # a writable copy
    else:
        t = dequantize(qt)
    return t.to(device=device, dtype=torch.float32).contiguous()


def matrix_shape(name: str, shape) -> tuple[int, int] | None:
    """The [rows, cols] matrix the engine uses a tensor as, or None for a vector: a qwen35moe expert stack
    [E, rows, cols] is one [E * rows, cols] matrix, the shared-expert gate [d] a 1-row matrix, conv1d a vector."""
    shape = tuple(shape)
    if len(shape) == 3:
        return shape[0] * shape[1], shape[2]
    if name.endswith("ffn_gate_inp_shexp.weight"):
        return 1, shape[0]
    if len(shape) == 2 and not name.endswith("ssm_conv1d.weight"):
        return shape
    return None


class DeviceWeights:
    """All tensors of a qwen35 GGUF on one device: `mat[name]` QWeight, `vec[name]` fp32 tensor."""

    def __init__(self, model: GGUFModel, device):
        device = torch.device(device)
        mat: dict[str, QWeight] = {}
        vec: dict[str, torch.Tensor] = {}
        for name, qt in model.tensors.items():
            shape = matrix_shape(name, qt.shape)
            if shape is None:  # norms, ssm_a, ssm_dt.bias, conv1d [Cc, 4]
                vec[name] = _vector(qt, device)
            else:
                mat[name] = upload_matrix(qt if shape == tuple(qt.shape) else QTensor(name, qt.type, shape, qt.data),
                                          device)
        self._set(model.config, device, mat, vec, model.lm_head_name)

    def _set(self, config, device, mat, vec, lm_head_name) -> None:
        self.config = config
        self.device = torch.device(device)
        self.mat: dict[str, QWeight] = mat
        self.vec: dict[str, torch.Tensor] = vec
        self.lm_head = self.mat[lm_head_name]
        self.embedding = self.mat["token_embd.weight"]

    @classmethod
    def from_parts(cls, config, device, mat: dict, vec: dict, lm_head_name: str) -> "DeviceWeights":
        """Weights already on `device` (e.g. meta tensors for recording launches without a GPU)."""
        self = cls.__new__(cls)
        self._set(config, device, mat, vec, lm_head_name)
        return self

    @property
    def nbytes(self) -> int:
        return sum(w.nbytes for w in self.mat.values()) + sum(t.numel() * 4 for t in self.vec.values())

    def decode_bytes_per_token(self) -> int:
        """Weight bytes one decode step reads: every matrix once, the embedding as one row only.

        With tied embeddings the table is the LM head and is read in full by it.
        """
        total = sum(w.nbytes for n, w in self.mat.items() if n != "token_embd.weight" and not n.endswith("_exps.weight"))
        if getattr(self.config, "is_moe", False):  # only k of E experts per stack are read
            from .moe import active_bytes_per_token

            total += active_bytes_per_token(self)
        if self.config.tied_embeddings:
            total += self.embedding.nbytes
        else:
            total += self.embedding.row_bytes if self.embedding.is_block else self.embedding.cols * self.embedding.data.element_size()
        return total + sum(t.numel() * 4 for t in self.vec.values())


# byte offsets of the f16 scale fields inside one block, per block type
_F16_FIELDS = {GGMLType.Q4_K: (0, 2), GGMLType.Q5_K: (0, 2), GGMLType.Q6_K: (208,), GGMLType.Q8_0: (0,)}


def random_qweight(qtype: GGMLType, rows: int, cols: int, device, seed: int = 0, name: str = "random") -> QWeight:
    """A matrix of random blocks: random quant bytes, f16 scales drawn in a sane range.

    Every bit of every field is exercised, which is what a kernel-vs-dequantizer check needs.
    """
    qtype = GGMLType(qtype)
    rng = np.random.default_rng(seed)
    if qtype in FLOAT_TYPES:
        vals = rng.standard_normal((rows, cols)).astype(np.float32) * 0.05
        t = torch.from_numpy(vals).to(FLOAT_TYPES[qtype])
        return QWeight(name, qtype, rows, cols, t.to(device).contiguous())
    per_block, nbytes = BLOCK[qtype]
    nb = cols // per_block
    if cols % per_block:
        raise ValueError(f"{cols} columns is not a multiple of the {qtype.name} block size {per_block}")
    raw = rng.integers(0, 256, size=(rows, nb, nbytes), dtype=np.uint8)
    for off in _F16_FIELDS[qtype]:
        scale = rng.uniform(0.2e-3, 2e-3, size=(rows, nb)).astype(np.float16)
        raw[:, :, off : off + 2] = scale.view(np.uint8).reshape(rows, nb, 2)
    return qweight_from_host(name, qtype, rows, cols, raw.reshape(rows, nb * nbytes), device)
