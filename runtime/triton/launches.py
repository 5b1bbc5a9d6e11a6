"""The decode step's kernel launches, recorded and compiled for a CUDA target without a GPU.

`record_decode_launches(cfg)` builds one decode step on the meta device (weights of the real
shapes and Q4_K_M types, state, buffers: no memory, no data), runs it with Triton's launch
replaced by a recorder, and returns every launch: kernel, argument types, constexprs, launch
options and grid. `compile_launch` compiles one for e.g. sm_90 with Triton's bundled ptxas;
that catches what the interpreter lets through (types, layouts, unsupported ops, register
allocation). The grids also tell how many programs each launch puts on the SMs.

Must run with TRITON_INTERPRET unset (the kernels must be JITFunctions, not interpreted).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch

from ..config import ModelConfig
from ..gguf.types import BLOCK
from ..gguf.names import expected_tensors

_PTR = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.uint8: "u8", torch.int8: "i8",
        torch.int32: "i32", torch.int64: "i64"}
META = torch.device("meta")


@dataclass
class Launch:
    kernel: str
    fn: Any  # the JITFunction
    signature: dict[str, str]
    constexprs: dict[str, Any]
    attrs: dict[tuple, list]
    options: dict[str, Any]
    grid: tuple[int, ...]
    tags: list[str] = field(default_factory=list)

    @property
    def key(self) -> tuple:
        return (self.kernel, tuple(self.signature.items()), tuple(sorted((k, repr(v)) for k, v in self.constexprs.items())),
                tuple(sorted(self.options.items())))

    @property
    def programs(self) -> int:
        n = 1
        for g in self.grid:
            n *= g
        return n


def _arg_type(value) -> tuple[str, bool]:
    """Triton signature type of a runtime argument, and whether it is 16-divisible (alignment attr)."""
    if isinstance(value, torch.Tensor):
        if value.dtype not in _PTR:
            raise ValueError(f"no Triton pointer type for {value.dtype}")
        return "*" + _PTR[value.dtype], (value.storage_offset() * value.element_size()) % 16 == 0
    if isinstance(value, bool):
        return "i1", False
    if isinstance(value, int):
        return ("i32" if -(2**31) <= value < 2**31 else "i64"), value % 16 == 0
    if isinstance(value, float):
        return "fp32", False
    raise ValueError(f"unsupported kernel argument {value!r}")


class _Recorder:
    """Context manager: JITFunction.run records its launch instead of compiling and running it."""

    def __init__(self):
        self.launches: list[Launch] = []
        self.tag: str = ""

    def __enter__(self):
        from triton.runtime.jit import JITFunction

        self._cls, self._orig = JITFunction, JITFunction.run
        rec = self

        def run(fn, *args, grid, warmup=False, **kwargs):
            params = inspect.signature(fn.fn).parameters
            options = {k: v for k, v in kwargs.items() if k not in params}
            bound = inspect.signature(fn.fn).bind(*args, **{k: v for k, v in kwargs.items() if k in params})
            bound.apply_defaults()
            sig, const, attrs = {}, {}, {}
            for i, (name, value) in enumerate(bound.arguments.items()):
                if i in fn.constexprs:
                    sig[name], const[name] = "constexpr", value
                    continue
                sig[name], div16 = _arg_type(value)
                if div16:
                    attrs[(i,)] = [["tt.divisibility", 16]]
            g = grid(bound.arguments) if callable(grid) else grid
            rec.launches.append(Launch(fn.fn.__name__, fn, sig, const, attrs,
                                       {k: v for k, v in options.items() if k in ("num_warps", "num_stages", "launch_pdl")},
                                       tuple(int(x) for x in g), [rec.tag] if rec.tag else []))

        JITFunction.run = run
        return self

    def __exit__(self, *exc):
        self._cls.run = self._orig
        return False


def meta_weights(cfg: ModelConfig, mix: str = "q4_k_m"):
    """DeviceWeights of `cfg` with every tensor a meta tensor of its real shape and GGUF type."""
    from ..quant import tensor_types
    from .weights import FLOAT_TYPES, DeviceWeights, QWeight, matrix_shape

    types = tensor_types(cfg, mix)
    mat, vec = {}, {}
    for name, shape in expected_tensors(cfg).items():
        as_matrix = matrix_shape(name, shape)
        if as_matrix is not None:
            t = types[name]
            rows, cols = as_matrix
            if t in FLOAT_TYPES:
                data = torch.empty(rows, cols, dtype=FLOAT_TYPES[t], device=META)
            else:
                per_block, nbytes = BLOCK[t]
                data = torch.empty(rows, cols // per_block * nbytes, dtype=torch.uint8, device=META)
            mat[name] = QWeight(name, t, rows, cols, data)
        else:
            vec[name] = torch.empty(shape, dtype=torch.float32, device=META)
    lm_head = "token_embd.weight" if cfg.tied_embeddings else "output.weight"
    return DeviceWeights.from_parts(cfg, META, mat, vec, lm_head)


def record_decode_launches(cfg: ModelConfig, *, n_sm: int = 132, max_context: int = 32768, mix: str = "q4_k_m",
                           **step_options) -> list[Launch]:
    """Every kernel launch of one decode step of `cfg` as the engine would issue it on a GPU with n_sm SMs."""
    from ..kernels.attn_decode import default_n_split
    from ..kernels.gemv import kernel as gemv_kernel
    from .decode import DecodeBuffers, DecodeState, DecodeStep

    gemv_kernel.set_sm_count(META, n_sm)
    if "gemv_config" not in step_options:  # what the engine launches on sm_90 (runtime/kernels/gemv/tiles.py)
        from ..kernels.gemv.tiles import sm90_table

        step_options["gemv_config"] = sm90_table()
    w = meta_weights(cfg, mix)
    state = DecodeState(cfg, max_context, META)
    bufs = DecodeBuffers(cfg, max_context, META, default_n_split(max_context, n_sm))
    step = DecodeStep(w, state, bufs, **step_options)
    with _Recorder() as rec:
        step()
    return rec.launches


def unique_launches(launches: list[Launch]) -> list[Launch]:
    seen: dict[tuple, Launch] = {}
    for launch in launches:
        if launch.key in seen:
            seen[launch.key].tags.extend(t for t in launch.tags if t not in seen[launch.key].tags)
        else:
            seen[launch.key] = launch
    return list(seen.values())


def compile_launch(launch: Launch, arch: int = 90):
    """Compile one recorded launch for CUDA sm_<arch> (to cubin); raises on a compile error."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    src = ASTSource(fn=launch.fn, signature=launch.signature, constexprs=launch.constexprs, attrs=launch.attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(launch.options))


def launched_kernels(launches: list[Launch]) -> set[str]:
    return {launch.kernel for launch in launches}


def kernel_functions() -> dict[str, Any]:
    """Every top-level @triton.jit kernel of runtime/kernels (helpers called by other kernels excluded)."""
    import importlib
    import importlib.util
    import pkgutil

    from triton.runtime.jit import JITFunction

    from .. import kernels

    jits: dict[str, Any] = {}
    for mod in pkgutil.iter_modules(kernels.__path__):
        if not mod.ispkg:  # a shared helper module (tl_utils), no kernels
            continue
        if importlib.util.find_spec(f"{kernels.__name__}.{mod.name}.kernel") is None:
            continue  # a helper package (pdl), no kernels
        m = importlib.import_module(f"{kernels.__name__}.{mod.name}.kernel")
        jits.update({name: obj for name, obj in vars(m).items() if isinstance(obj, JITFunction)})
    sources = {name: inspect.getsource(f.fn) for name, f in jits.items()}
    return {name: f for name, f in jits.items()
            if not any(f"{name}(" in src for other, src in sources.items() if other != name)}


def resource_usage(kernel) -> dict | None:
    """Registers and local memory (spills) of a compiled kernel, from Triton's bundled cuobjdump;
    None when the tool is not there."""
    import os
    import re
    import shutil
    import subprocess
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        tool = shutil.which("cuobjdump")
    if not tool or "cubin" not in kernel.asm:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", out)
    if not m:
        return None
    return {"registers": int(m[1]), "stack_bytes": int(m[2]), "shared_bytes": int(m[3]), "local_bytes": int(m[4])}


_PENDING: list[Launch] = []


_ARCH = [90]


def _compile_index(i: int) -> tuple[int, str | None, float, dict | None]:
    import time

    t = time.perf_counter()
    try:
        kernel = compile_launch(_PENDING[i], _ARCH[0])
        return i, None, time.perf_counter() - t, resource_usage(kernel)
    except Exception as e:  # report every failure, not just the first
        msg = f"{type(e).__name__}: {e}"
        cause = e.__cause__
        while cause is not None:
            msg += f"\ncaused by {type(cause).__name__}: {cause}"
            cause = cause.__cause__
        return i, msg[-4000:], time.perf_counter() - t, None


def compile_all(launches: list[Launch], jobs: int = 1, arch: int = 90) -> list[tuple]:
    """Compile each launch (forked worker processes when jobs > 1); (launch, error or None, seconds,
    resource usage or None)."""
    import multiprocessing

    _PENDING[:] = launches
    _ARCH[0] = arch
    if jobs <= 1:
        results = [_compile_index(i) for i in range(len(launches))]
    else:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            results = pool.map(_compile_index, range(len(launches)), chunksize=1)
    return [(launches[i], err, secs, res) for i, err, secs, res in results]


def main(argv=None) -> int:
    import argparse
    import json
    import os
    import time

    from ..config import SHAPES

    ap = argparse.ArgumentParser(description="Record the decode step's launches and compile them for sm_90 "
                                             "without a GPU (TRITON_INTERPRET must be unset).")
    ap.add_argument("--shapes", default="tiny,0.8b,4b,9b")
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--json", action="store_true", help="print one JSON summary line")
    ap.add_argument("--no-variants", dest="variants", action="store_false",
                    help="only the default engine options (not the bench's PDL / split-GDN variants)")
    ap.add_argument("--variant-sets", type=int, default=None,
                    help="only the first N variant option sets (the first launches the split-GDN kernels)")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        ap.error("unset TRITON_INTERPRET: the interpreter replaces the kernels this compiles")
    t0 = time.perf_counter()
    launches = []
    for shape in args.shapes.split(","):
        for launch in record_decode_launches(SHAPES[shape]):
            launch.tags.append(shape)
            launches.append(launch)
    if args.variants:  # the bench's PDL and split-GDN variants, first shape only (compile time; the q6=2 and
        # acc=1 GEMV paths are covered by the interpreter tests and report their own errors in the bench)
        from ..kernels.gemv import AutoTile
        from ..kernels.gemv.tiles import sm90_table

        shape = args.shapes.split(",")[0]
        for opts in ({"gemv_config": AutoTile(2, pdl=True), "gdn_block_v": 32, "pdl": True}, {"gdn_pdl": True},
                     {"gemv_config": AutoTile(2, pdl=True, prefetch=False), "pdl": True},
                     {"gemv_config": AutoTile(2)}, {"gemv_config": AutoTile(3)},
                     {"gemv_config": AutoTile(2, num_stages=1)}, {"gemv_config": AutoTile(2, num_stages=4)},
                     {"gemv_config": AutoTile(2, bn_scale=2, num_warps=8)}, {"gemv_config": AutoTile(3, x8=True)},
                     {"gemv_config": sm90_table().replaced(x8=True, x8_q6=True)})[:args.variant_sets]:  # x8 variants
            for launch in record_decode_launches(SHAPES[shape], **opts):
                launch.tags.append(f"{shape}+variants")
                launches.append(launch)
    unique = unique_launches(launches)
    results = compile_all(unique, args.jobs, args.arch)
    summary = {
        "kernels_defined": sorted(kernel_functions()),
        "kernels_launched": sorted(launched_kernels(unique)),
        "compiled": [{"kernel": lc.kernel, "constexprs": {k: repr(v) for k, v in lc.constexprs.items()},
                      "options": lc.options, "grid": lc.grid, "shapes": lc.tags, "seconds": round(s, 2), "error": err,
                      "resources": res}
                     for lc, err, s, res in results],
        "seconds": round(time.perf_counter() - t0, 1),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        for r in summary["compiled"]:
            status = "ok" if r["error"] is None else "FAIL"
            res = r["resources"] or {}
            print(f"{status:4} {r['seconds']:5.1f}s {r['kernel']:24} grid={r['grid']} regs={res.get('registers')} "
                  f"local={res.get('local_bytes')} {r['shapes']} {r['constexprs']}")
            if r["error"]:
                print(r["error"])
        print(f"{len(summary['compiled'])} specializations in {summary['seconds']} s")
    return 0 if all(r["error"] is None for r in summary["compiled"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
