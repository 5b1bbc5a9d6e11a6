"""A prefill-only engine with the buffers prefill_forward reads (see prefill.py's docstring), for
bench/runtime/prefill.py when there is no GGUF file: `random_engine` makes Q4_K_M-typed random weights
directly on the device (prefill speed does not depend on weight values). It has no decode path;
for real files use TritonEngine.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..gguf import BLOCK, GGMLType
from .decode import DecodeState
from .prefill import prefill_forward


@dataclass(frozen=True)
class StandInMatrix:
    qtype: GGMLType
    rows: int
    cols: int
    data: torch.Tensor  # uint8 [rows, row_bytes] (block types) or typed [rows, cols]


class StandInWeights:
    """The DeviceWeights fields prefill reads: mat, vec, lm_head (filled by random_engine)."""

    def __init__(self):
        self.mat: dict[str, StandInMatrix] = {}
        self.vec: dict[str, torch.Tensor] = {}
        self.lm_head: StandInMatrix | None = None

    @property
    def nbytes(self) -> int:
        return sum(m.data.numel() * m.data.element_size() for m in self.mat.values()) + sum(
            v.numel() * 4 for v in self.vec.values())


class StandInEngine:
    """One sequence: weights, the decode state layout (GDN conv/recurrent states, bf16 KV caches), position."""

    def __init__(self, config, weights: StandInWeights, device="cuda", max_context: int = 4096):
        self.config = config
        self.device = torch.device(device)
        self.max_context = max_context
        self.weights = weights
        self.state = DecodeState(config, max_context, self.device)
        self.position = 0

    def prefill(self, token_ids, *, all_logits: bool = False, chunk_size: int | None = None) -> torch.Tensor:
        ids = torch.as_tensor(token_ids, dtype=torch.int64).reshape(-1)
        logits = prefill_forward(self, ids, all_logits, chunk_size=chunk_size)
        self.position += ids.numel()
        self.state.pos.fill_(self.position)
        return logits

    def reset(self) -> None:
        self.state.zero_()
        self.position = 0


def q4_k_m_type(name: str, cfg) -> GGMLType:
    """The tensor type stock llama-quantize Q4_K_M gives `name` (architecture reference §8.4)."""
    if name == "output.weight" or (name == "token_embd.weight" and cfg.tied_embeddings):
        return GGMLType.Q6_K
    if name.endswith(("attn_v.weight", "attn_qkv.weight", "ffn_down.weight")):
        i, n = int(name.split(".")[1]), cfg.n_layers
        if i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2:
            return GGMLType.Q6_K
    return GGMLType.Q4_K


def random_engine(cfg, device="cuda", max_context: int = 4096, seed: int = 0) -> StandInEngine:
    """An engine with random Q4_K_M-typed weights made on the device (speed runs when no GGUF exists).

    Quant bytes are uniform random with small finite f16 scales; norms 1, conv taps small, gates sane.
    """
    from ..gguf.names import expected_tensors

    gen = torch.Generator(device=device).manual_seed(seed)
    w = StandInWeights()
    f16_fields = {GGMLType.Q4_K: (0, 2), GGMLType.Q6_K: (208,)}
    for name, shape in expected_tensors(cfg).items():
        if len(shape) == 2 and not name.endswith("ssm_conv1d.weight"):
            rows, cols = shape
            qtype = q4_k_m_type(name, cfg)
            per_block, nbytes = BLOCK[qtype]
            nb = cols // per_block
            raw = torch.randint(0, 256, (rows, nb, nbytes), dtype=torch.uint8, device=device, generator=gen)
            for off in f16_fields[qtype]:
                scale = torch.full((rows, nb), 2e-4 if qtype == GGMLType.Q4_K else 5e-5, dtype=torch.float16, device=device)
                raw[:, :, off : off + 2] = scale.view(torch.uint8).reshape(rows, nb, 2)
            w.mat[name] = StandInMatrix(qtype, rows, cols, raw.reshape(rows, nb * nbytes))
        elif name.endswith("ssm_a"):
            w.vec[name] = -torch.rand(shape, device=device, generator=gen) - 0.1
        elif name.endswith("ssm_conv1d.weight"):
            w.vec[name] = torch.randn(shape, device=device, generator=gen) * 0.3
        elif name.endswith("ssm_dt.bias"):
            w.vec[name] = torch.zeros(shape, device=device)
        else:  # norms
            w.vec[name] = torch.ones(shape, device=device)
    w.lm_head = w.mat["token_embd.weight" if cfg.tied_embeddings else "output.weight"]
    return StandInEngine(cfg, w, device, max_context)
