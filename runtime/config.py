"""Qwen3.5 (`qwen35`) and Qwen3.5-MoE (`qwen35moe`) hyper-parameters and the named shapes we synthesise.

Numbers follow docs: docs/qwen35-architecture.md §2, §8.2 and §13 (the MoE sibling).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

ARCH = "qwen35"
MOE_ARCH = "qwen35moe"  # same stack, the FFN replaced by routed experts + one gated shared expert


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

    @property
    def arch(self) -> str:
        """general.architecture of a GGUF of this config (also the metadata key prefix)."""
        return ARCH

    @property
    def is_moe(self) -> bool:
        return False

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        if cls is ModelConfig and d.get("n_expert"):
            return MoeConfig(**d)
        return cls(**d)


@dataclass(frozen=True, slots=True)
class MoeConfig(ModelConfig):
    """qwen35moe: every layer's FFN is `n_expert` routed SwiGLU experts of width `d_ffn_exp` (softmax
    router over all experts, top `n_expert_used`, weights renormalised) plus one shared SwiGLU expert
    of width `d_ffn_shexp` scaled by sigmoid(ffn_gate_inp_shexp · x). `d_ffn` is the shared width."""

    n_expert: int = 0
    n_expert_used: int = 0
    d_ffn_exp: int = 0
    d_ffn_shexp: int = 0

    def __post_init__(self):
        if not 1 <= self.n_expert_used <= self.n_expert:
            raise ValueError(f"MoE config: need 1 <= n_expert_used ({self.n_expert_used}) <= n_expert ({self.n_expert})")
        if self.d_ffn_exp < 1 or self.d_ffn_shexp < 1:
            raise ValueError(f"MoE config: expert widths must be positive ({self.d_ffn_exp}, {self.d_ffn_shexp})")

    @property
    def arch(self) -> str:
        return MOE_ARCH

    @property
    def is_moe(self) -> bool:
        return True


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
    # §13: 40 layers (10 attention), d 2048, Hq 16 / Hkv 2, Hk 16 / Hv 32, 256 experts of width 512,
    # top-8, one shared expert of width 512, untied head.
    "35b-a3b": MoeConfig(40, 2048, 512, 248320, 16, 2, 16, 32, tied_embeddings=False, name="35b-a3b",
                         n_expert=256, n_expert_used=8, d_ffn_exp=512, d_ffn_shexp=512),
    # The MoE at CPU-test size: 1 attention + 3 DeltaNet layers, 16 experts of width 256, top-4.
    "tiny-moe": MoeConfig(4, 256, 256, 4096, 2, 1, 2, 4, tied_embeddings=False, context_length=8192,
                          name="tiny-moe", n_expert=16, n_expert_used=4, d_ffn_exp=256, d_ffn_shexp=256),
}


def shape(name: str) -> ModelConfig:
    try:
        return SHAPES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown shape {name!r}; choose one of {', '.join(SHAPES)}") from None


def with_overrides(cfg: ModelConfig, **kw) -> ModelConfig:
    return replace(cfg, **kw)
