"""Model forwards. `qwen35_reference` is the fp32 pure-torch reference; `deltanet_ref` and
`attention_ref` hold the per-op reference functions that kernels are tested against."""
from .qwen35_reference import Qwen35Reference, Qwen35State, check_weights, weights_from_gguf

__all__ = ["Qwen35Reference", "Qwen35State", "check_weights", "weights_from_gguf"]
