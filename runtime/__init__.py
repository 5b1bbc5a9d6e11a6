"""tokengate's Triton runtime for the Qwen3.5 (`qwen35`) model family.

Usable alone: `runtime.load_engine(path, device=...)` returns an Engine (docs/protocol.md).
"""
from .config import SHAPES, ModelConfig

PROTOCOL_VERSION = 1


def load_engine(gguf_path, *, device: str = "cpu", max_context: int = 4096, backend: str = "auto"):
    """Open a qwen35 GGUF and return an Engine that implements docs/protocol.md."""
    from .engine import load_engine as _load

    return _load(gguf_path, device=device, max_context=max_context, backend=backend)


__all__ = ["SHAPES", "ModelConfig", "PROTOCOL_VERSION", "load_engine"]
