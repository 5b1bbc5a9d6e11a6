"""Make a synthetic model's tensor bytes on a pool of threads, in the writer's order.

Every tensor is cut into the chunks `init.generate` yields; each chunk is a pure function of
(seed, tensor name, chunk index), so chunks can be made in any order and on any thread and
the bytes stay the same.  A worker thread generates a chunk on the CPU (random numbers are
drawn on the CPU on purpose) and then either quantizes it on the CPU too, or, when the
quantization runs on a GPU, copies it there; the consumer (the writer's thread) quantizes
runs of GPU chunks in large calls and hands the bytes to the writer in file order.

Two phases:
1. Tensors built from orthonormal bases (`init.uses_basis`) are made first, on the calling
   thread at its torch thread count: LAPACK's QR result depends on that count, and earlier
   files were made this way.  They are few (8 per model) and held until written.
2. Everything else on `workers` threads of `max(1, threads // workers)` torch threads each
   (none of it uses BLAS/LAPACK, so the thread count cannot change a byte).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from ..config import ModelConfig
from ..gguf.types import BLOCK, GGMLType
from ..gguf.writer import TensorSpec
from . import init as synth_init
from .encode import quantize_rows
from .prefetch import ordered_map

PASSTHROUGH = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)  # converted on the CPU, never quantized
MAX_GPU_GROUP_WEIGHTS = 1 << 28  # weights per GPU quantizer call (≈ 20 fp32 temporaries of this size)


def gpu_group_weights(device: str) -> int:
    """Weights per GPU quantize call: MAX_GPU_GROUP_WEIGHTS, less on a GPU with little free memory."""
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return max(1 << 20, min(MAX_GPU_GROUP_WEIGHTS, free // 128))  # 32 fp32 temporaries of headroom


@dataclass(frozen=True)
class Chunk:
    spec: TensorSpec
    index: int
    n_elems: int

    @property
    def fp32_nbytes(self) -> int:  # what it weighs while in flight (an upper bound once quantized)
        return 4 * self.n_elems


def chunks(tensors: list[TensorSpec], spec: synth_init.InitSpec) -> list[Chunk]:
    """Every chunk of every tensor, in file order."""
    out = []
    for t in tensors:
        n = synth_init.chunk_count(t.name, t.shape, spec)
        total = int(np.prod(t.shape))
        if n == 1:
            out.append(Chunk(t, 0, total))
            continue
        rows, cols = t.shape[0], int(np.prod(t.shape[1:]))
        step = synth_init.chunk_rows(t.name, t.shape, spec)
        out += [Chunk(t, k, (min(rows, (k + 1) * step) - k * step) * cols) for k in range(n)]
    return out


def runs(chunks: list[Chunk], grouped: Callable[[Chunk], bool], cap: int) -> list[int]:
    """Lengths of the consecutive runs of `chunks` that the consumer takes at once.

    A grouped chunk (quantized by the consumer) opens a run that takes the following grouped
    chunks of its type while their weights fit in `cap`, carrying along the worker-made chunks
    in between; any other chunk is a run of its own.  Why: the GPU quantizer costs thousands
    of kernel launches per call whatever its size, so one call per chunk would make launches
    the bottleneck; and every ggml block is quantized on its own, so concatenating the blocks
    of several chunks (of several tensors, of any row length) gives the same bytes."""
    out, i = [], 0
    while i < len(chunks):
        first, j = chunks[i], i + 1
        if grouped(first):
            weights = first.n_elems
            while j < len(chunks):
                c = chunks[j]
                if grouped(c):
                    if c.spec.type != first.spec.type or weights + c.n_elems > cap:
                        break
                    weights += c.n_elems
                j += 1
        out.append(j - i)
        i = j
    return out


def as_rows(x: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """A chunk as fp32 rows [n, cols] (or a flat vector for 1-D tensors), as the quantizers take it."""
    return (x.reshape(-1, shape[-1]) if len(shape) > 1 else x.reshape(-1)).float()


@dataclass
class Timings:
    """Seconds spent per stage (the consumer's view, plus the summed worker time)."""

    prepare: float = 0.0  # phase 1, on the calling thread
    generate: float = 0.0  # summed over worker threads (generation + CPU quantization + copies)
    wait: float = 0.0  # the consumer waiting for the next chunk
    quantize: float = 0.0  # the consumer quantizing on the GPU (incl. the copy back)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_worker(self, seconds: float) -> None:
        with self.lock:
            self.generate += seconds

    def as_dict(self) -> dict[str, float]:
        return {k: round(getattr(self, k), 3) for k in ("prepare", "generate", "wait", "quantize")}


class ChunkStream:
    """Iterate `pieces(t)` for each tensor of `tensors`, in order, to get its bytes."""

    def __init__(
        self,
        tensors: list[TensorSpec],
        cfg: ModelConfig,
        seed: int,
        spec: synth_init.InitSpec,
        device: str,
        *,
        workers: int,
        inflight_bytes: int,
        consumer_quantizes: bool | None = None,
    ):
        """`consumer_quantizes`: quantize on the consumer's thread, in groups (default: when
        `device` is a GPU; True on the CPU only to test the grouping without one)."""
        self.cfg, self.seed, self.spec, self.device = cfg, seed, spec, device
        self.gpu = device.startswith("cuda")
        self._grouped = self.gpu if consumer_quantizes is None else consumer_quantizes
        self.timings = Timings()
        t0 = time.perf_counter()
        self._prepared = {
            t.name: synth_init.generate_chunk(t.name, t.shape, cfg, seed, spec, 0)
            for t in tensors
            if synth_init.uses_basis(t.name, cfg)
        }
        self.timings.prepare = time.perf_counter() - t0
        self._threads = max(1, torch.get_num_threads() // workers)
        self._local = threading.local()
        self._group_weights = gpu_group_weights(device) if self.gpu else MAX_GPU_GROUP_WEIGHTS
        self._chunks = chunks(tensors, spec)
        self._runs = deque(runs(self._chunks, self._in_group, self._group_weights))
        self._ready: deque[tuple[Chunk, np.ndarray]] = deque()
        self._results = ordered_map(
            self._make, self._chunks, workers=workers, cost=lambda c: c.fp32_nbytes,
            budget=inflight_bytes, initializer=self._init_worker,
        )

    # -- worker side -------------------------------------------------------------------------
    def _init_worker(self) -> None:
        torch.set_num_threads(self._threads)  # per thread (OpenMP and MKL settings are thread-local)
        if self.gpu:
            self._local.stream = torch.cuda.Stream(device=self.device)

    def _in_group(self, c: Chunk) -> bool:
        """Whether the consumer quantizes `c` (in a group) rather than the worker."""
        return self._grouped and c.spec.type not in PASSTHROUGH

    def _make(self, c: Chunk):
        t0 = time.perf_counter()
        t = c.spec
        x = self._prepared.pop(t.name, None)
        if x is None:
            x = synth_init.generate_chunk(t.name, t.shape, self.cfg, self.seed, self.spec, c.index)
        rows = as_rows(x, t.shape)
        if self._in_group(c) and self.gpu:
            # Copy on this thread's own stream so the consumer's quantization never waits on it.
            with torch.cuda.stream(self._local.stream):
                out = rows.to(self.device, non_blocking=True)
            self._local.stream.synchronize()
        elif self._in_group(c):
            out = rows
        else:
            out = quantize_rows(rows, t.type, "cpu")
        self.timings.add_worker(time.perf_counter() - t0)
        return out

    # -- consumer side -----------------------------------------------------------------------
    def _take(self) -> tuple[Chunk, object]:
        t0 = time.perf_counter()
        c, made = next(self._results)
        self.timings.wait += time.perf_counter() - t0
        return c, made

    def _refill(self) -> None:
        """Take the next run of chunks (see `runs`) and quantize its grouped ones in one call."""
        taken = [self._take() for _ in range(self._runs.popleft())]
        group = [made for c, made in taken if isinstance(made, torch.Tensor)]
        if group:
            t0 = time.perf_counter()
            kind = taken[0][0].spec.type
            if self.gpu:
                stream = torch.cuda.current_stream(group[0].device)
                for m in group:
                    m.record_stream(stream)  # allocated on a worker's stream, used on this one
            per_block = BLOCK[kind][0]
            blocks = torch.cat([m.reshape(-1, per_block) for m in group])
            out = quantize_rows(blocks, kind, self.device, chunk_weights=self._group_weights if self.gpu else None)
            self.timings.quantize += time.perf_counter() - t0
            a = 0
        for c, made in taken:
            if isinstance(made, torch.Tensor):
                b = a + made.numel() // per_block
                made, a = out[a:b], b
            self._ready.append((c, made))

    def pieces(self, t: TensorSpec) -> Iterator[np.ndarray]:
        for _ in range(synth_init.chunk_count(t.name, t.shape, self.spec)):
            if not self._ready:
                self._refill()
            c, data = self._ready.popleft()
            assert c.spec.name == t.name, f"stream out of order: {c.spec.name} for {t.name}"
            yield data

    def close(self) -> None:
        self._results.close()  # stops the pool (also on errors half-way)
        torch.set_num_threads(torch.get_num_threads())  # the workers changed torch's global default
        self._prepared.clear()
