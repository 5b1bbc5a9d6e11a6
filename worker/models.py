"""Model files for an evaluation: synthetic GGUFs made by the deployed runtime, cached by their args."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from worker.config import ModelSpec
from worker.paths import cache_dir


class ModelError(RuntimeError):
    """The model file could not be made or read (INFRA)."""


@dataclass(frozen=True)
class ResolvedModel:
    spec: ModelSpec
    path: Path
    sha256: str


def sha256_file(path: Path) -> str:
    """sha256 of a file, cached under the cache dir by (path, size, mtime) since GGUFs can be large.

    Never written beside the model: model directories may be shared and read-only.
    """
    path = path.resolve()
    st = path.stat()
    side = cache_dir() / "sha256" / (hashlib.sha256(str(path).encode()).hexdigest()[:32] + ".txt")
    side.parent.mkdir(parents=True, exist_ok=True)
    stamp = f"{st.st_size}:{st.st_mtime_ns}"
    try:
        cached_stamp, digest = side.read_text().split()
        if cached_stamp == stamp:
            return digest
    except (OSError, ValueError):
        pass
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    digest = h.hexdigest()
    try:
        side.write_text(f"{stamp} {digest}\n")
    except OSError:
        pass
    return digest


def synth_path(synth: dict) -> Path:
    s = synth
    return cache_dir() / "models" / f"synth-{s['shape']}-{s['quant']}-seed{s.get('seed', 0)}.gguf"


def make_synth(synth: dict, trusted_root: Path, timeout: float = 1800, device: str = "cpu") -> Path:
    """Make (once per worker: the cache dir is its volume) the synthetic model with the deployed
    runtime's factory; on a CUDA worker the factory quantizes on the GPU (9B: ~30 s instead of minutes)."""
    out = synth_path(synth)
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    cmd = [sys.executable, "-c", "import sys, runtime.cli; sys.exit(runtime.cli.main(sys.argv[1:]))", "synth", "--shape", str(synth["shape"]),
           "--quant", str(synth["quant"]), "--seed", str(synth.get("seed", 0)), "-o", str(tmp), "--quiet",
           "--device", "cuda" if device.startswith("cuda") else "cpu"]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(trusted_root),
           "HOME": str(cache_dir()),
           **{k: os.environ[k] for k in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "LD_LIBRARY_PATH")
              if k in os.environ}}
    try:
        p = subprocess.run(cmd, cwd=trusted_root, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise ModelError(f"synthetic model {synth} timed out after {timeout:.0f} s") from exc
    if p.returncode != 0 or not tmp.exists():
        tmp.unlink(missing_ok=True)
        raise ModelError(f"could not make synthetic model {synth}: {(p.stderr or p.stdout).strip()[-600:]}")
    os.replace(tmp, out)
    return out


def resolve(spec: ModelSpec, trusted_root: Path, device: str = "cpu") -> ResolvedModel:
    if spec.path:
        path = Path(spec.path).expanduser()
        if not path.is_file():
            raise ModelError(f"model {spec.name}: {path} does not exist")
    else:
        path = make_synth(spec.synth, trusted_root, device=device)
    return ResolvedModel(spec, path.resolve(), sha256_file(path))
