"""`load_engine` and the reference Engine (docs/protocol.md §1–§2).

One engine = one sequence. The reference engine runs `Qwen35Reference` in fp32 on any
torch device: prefill uses the chunked delta rule and batched attention over the whole
input, decode the recurrent step.
"""
from __future__ import annotations

import operator
import os

import torch

from .config import ModelConfig
from .gguf import GGUFModel, load_gguf
from .models.qwen35_reference import Qwen35Reference

BACKENDS = ("auto", "reference", "triton")


def _check_device(device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device {device!r} is not a torch device ({e})") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: only 'cpu' and 'cuda[:N]' are supported")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return dev


def _positive_int(value, what: str, *, allow_zero: bool = False) -> int:
    """operator.index (accepts numpy ints, rejects floats and bools) plus a range check."""
    try:
        if isinstance(value, bool):
            raise TypeError
        n = operator.index(value)
    except TypeError:
        raise ValueError(f"{what} must be an int, got {value!r}") from None
    if n < (0 if allow_zero else 1):
        raise ValueError(f"{what} must be {'>= 0' if allow_zero else '>= 1'}, got {n}")
    return n


def load_engine(gguf_path: str | os.PathLike, *, device="cpu", max_context: int = 4096, backend: str = "auto"):
    """Open a qwen35 GGUF and return an Engine (docs/protocol.md).

    Raises GGUFError for a bad file and ValueError for bad arguments.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    max_context = _positive_int(max_context, "max_context")
    dev = _check_device(device)
    if backend == "auto":
        backend = "triton" if dev.type == "cuda" else "reference"
    if backend == "triton":
        if dev.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(f"backend 'triton' needs a CUDA device (or TRITON_INTERPRET=1 on the CPU), got {device!r}")
        try:
            from .triton import engine as triton_engine
        except ImportError as e:
            raise RuntimeError(
                f"backend 'triton' is unavailable: runtime.triton.engine cannot be imported ({e})"
            ) from e
        return triton_engine.load_engine(gguf_path, device=dev, max_context=max_context)
    return ReferenceEngine.from_gguf(gguf_path, device=dev, max_context=max_context)


class ReferenceEngine:
    """The protocol's Engine over the pure-torch fp32 reference model."""

    def __init__(self, model: Qwen35Reference, *, max_context: int):
        max_context = _positive_int(max_context, "max_context")
        self.model = model
        self.config: ModelConfig = model.cfg
        self.device = model.device
        self.max_context = max_context
        self._state = model.new_state(kv_capacity=min(max_context, 256))

    @classmethod
    def from_gguf(cls, gguf_path: str | os.PathLike | GGUFModel, *, device="cpu", max_context: int = 4096):
        gguf = gguf_path if isinstance(gguf_path, GGUFModel) else load_gguf(gguf_path)
        return cls(Qwen35Reference.from_gguf(gguf, device=device), max_context=max_context)

    @classmethod
    def from_tensors(cls, cfg: ModelConfig, tensors: dict[str, torch.Tensor], *, device="cpu", max_context: int = 4096):
        """An engine over in-memory weights (GGUF tensor names, torch order), e.g. a synthetic model."""
        return cls(Qwen35Reference(cfg, tensors, device=device), max_context=max_context)

    @property
    def position(self) -> int:
        return self._state.position

    # -- consuming tokens ----------------------------------------------------------------

    def _token_tensor(self, token_ids) -> torch.Tensor:
        ids = torch.as_tensor(token_ids)
        if ids.dim() == 0:
            ids = ids[None]
        if ids.dim() != 1:
            raise ValueError(f"token_ids must be 1-D, got shape {list(ids.shape)}")
        n = ids.shape[0]
        if n == 0:
            raise ValueError("token_ids is empty")
        if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.dtype.is_complex:
            raise ValueError(f"token_ids must be integers, got dtype {ids.dtype}")
        if self.position + n > self.max_context:
            raise ValueError(
                f"{n} tokens at position {self.position} exceed max_context {self.max_context} "
                f"(room for {self.max_context - self.position})"
            )
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.config.vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"token id {bad} out of range [0, {self.config.vocab_size})")
        return ids.to(device=self.device, dtype=torch.long)

    @torch.no_grad()
    def prefill(self, token_ids, *, all_logits: bool = False) -> torch.Tensor:
        ids = self._token_tensor(token_ids)
        return self.model.forward(ids, self._state, all_logits=all_logits)

    @torch.no_grad()
    def decode(self, token_id) -> torch.Tensor:
        ids = self._token_tensor(token_id)
        if ids.shape[0] != 1:
            raise ValueError(f"decode takes one token, got {ids.shape[0]}")
        return self.model.forward(ids, self._state, gdn_mode="recurrent")

    def generate_greedy(self, n: int) -> list[int]:
        n = _positive_int(n, "n", allow_zero=True)
        if self._state.last_logits is None:
            raise RuntimeError("generate_greedy needs a preceding prefill or decode")
        if self.position + n > self.max_context:
            raise ValueError(f"{n} steps at position {self.position} exceed max_context {self.max_context}")
        emitted = []
        logits = self._state.last_logits
        for _ in range(n):
            t = int(torch.argmax(logits))
            emitted.append(t)
            logits = self.decode(t)
        return emitted

    # -- state ------------------------------------------------------------------------------

    def snapshot(self) -> dict:
        return self._state.snapshot()

    def restore(self, snap: dict) -> None:
        if snap["position"] > self.max_context:
            raise ValueError(f"snapshot at position {snap['position']} exceeds max_context {self.max_context}")
        self._state.restore(snap)

    def reset(self) -> None:
        self._state.reset()

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def memory_stats(self) -> dict:
        peak = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None
        return {"weights_bytes": self.model.weights_bytes, "state_bytes": self._state.nbytes, "peak_bytes": peak}
