"""Qwen3.5 (`qwen35`) model hyper-parameters and the named shapes we synthesise.

Numbers follow docs: docs/qwen35-architecture.md §2 and §8.2.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

ARCH = "qwen35"


@dataclass(frozen=True, slots=True)
class ModelConfig:
    n_layers: int  # main-stack layers (MTP excluded)
    d_model: int
    d_ffn: int
    vocab_size: int
    n_head: int  # full-attention query heads (Hq)
    n_kv_head: int  # full-attention KV heads (Hkv)
    n_k_head: int  # Gated-DeltaNet key heads (Hk)
    n_v_head: int  # Gated-DeltaNet value heads (Hv)
    head_dim: int = 256  # attention head dim (Dh)
    ssm_head_dim: int = 128  # GDN dk == dv
    conv_kernel: int = 4
    rope_dims: int = 64
    rope_base: float = 1e7
    rms_eps: float = 1e-6
    full_attention_interval: int = 4
    tied_embeddings: bool = True
    context_length: int = 262144
    name: str = "custom"

    # -- derived widths (§2.2) -------------------------------------------------
    @property
    def key_dim(self) -> int:  # Ck
        return self.n_k_head * self.ssm_head_dim

    @property
    def value_dim(self) -> int:  # Cv
        return self.n_v_head * self.ssm_head_dim

    @property
    def conv_channels(self) -> int:  # Cc
        return 2 * self.key_dim + self.value_dim

    @property
    def q_proj_dim(self) -> int:  # query + output-gate rows, interleaved per head
        return 2 * self.n_head * self.head_dim

    @property
    def kv_proj_dim(self) -> int:
        return self.n_kv_head * self.head_dim

    def is_attention(self, layer: int) -> bool:
        """Layer i is gated full attention iff (i + 1) % interval == 0 (§1)."""
        return (layer + 1) % self.full_attention_interval == 0

    @property
    def attention_layers(self) -> list[int]:
        return [i for i in range(self.n_layers) if self.is_attention(i)]

    @property
    def deltanet_layers(self) -> list[int]:
        return [i for i in range(self.n_layers) if not self.is_attention(i)]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        return cls(**d)


# Real shapes (§2.1). 2B's linear heads are inferred (16/16) in the reference doc.
SHAPES: dict[str, ModelConfig] = {
    "0.8b": ModelConfig(24, 1024, 3584, 248320, 8, 2, 16, 16, tied_embeddings=True, name="0.8b"),
    "2b": ModelConfig(24, 2048, 6144, 248320, 8, 2, 16, 16, tied_embeddings=True, name="2b"),
    "4b": ModelConfig(32, 2560, 9216, 248320, 16, 4, 16, 32, tied_embeddings=True, name="4b"),
    "9b": ModelConfig(32, 4096, 12288, 248320, 16, 4, 16, 32, tied_embeddings=False, name="9b"),
    "27b": ModelConfig(64, 5120, 17408, 248320, 24, 4, 16, 48, tied_embeddings=False, name="27b"),
    # Same structure at CPU-test size: 2 attention + 6 DeltaNet layers, R = Hv/Hk = 2 so the
    # tiled value-head mapping is exercised, untied head, every row a multiple of 256.
    "tiny": ModelConfig(
        8, 256, 512, 4096, 2, 1, 2, 4, tied_embeddings=False, context_length=8192, name="tiny"
    ),
}


def shape(name: str) -> ModelConfig:
    try:
        return SHAPES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown shape {name!r}; choose one of {', '.join(SHAPES)}") from None


def with_overrides(cfg: ModelConfig, **kw) -> ModelConfig:
    return replace(cfg, **kw)
