"""bench/device/llama_src.py keeps what a CUDA build of llama-bench reads, drops the other backends and
everything else, names only llama-bench in tools/, and says when the mirror lacks a blob."""
import importlib.util
import subprocess
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "llama_src", Path(__file__).resolve().parents[3] / "bench" / "device" / "llama_src.py")
llama_src = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(llama_src)

FILES = ["CMakeLists.txt", "ggml/src/ggml-cuda/fattn.cu", "ggml/src/ggml-vulkan/vk.cpp", "src/llama.cpp",
         "tools/CMakeLists.txt", "tools/llama-bench/llama-bench.cpp", "tools/server/server.cpp",
         "models/big.gguf", "docs/x.md"]


def _mirror(tmp_path: Path) -> Path:
    work = tmp_path / "w"
    for f in FILES:
        (work / f).parent.mkdir(parents=True, exist_ok=True)
        (work / f).write_text(f"// {f}\n")
    git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    return work / ".git"


def test_keeps_the_build_drops_the_rest(tmp_path):
    git_dir = _mirror(tmp_path)
    dest = tmp_path / "out"
    assert llama_src.main([str(git_dir), "--rev", "HEAD", "--dest", str(dest)]) == 0
    got = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert got == ["CMakeLists.txt", "ggml/src/ggml-cuda/fattn.cu", "src/llama.cpp", "tools/CMakeLists.txt",
                   "tools/llama-bench/llama-bench.cpp"]
    assert (dest / "tools" / "CMakeLists.txt").read_text().strip().endswith("add_subdirectory(llama-bench)")


def test_a_missing_blob_is_said(tmp_path):
    git_dir = _mirror(tmp_path)
    sha = subprocess.run(["git", "--git-dir", str(git_dir), "rev-parse", "HEAD:src/llama.cpp"], check=True,
                         capture_output=True, text=True).stdout.strip()
    obj = git_dir / "objects" / sha[:2] / sha[2:]
    obj.unlink()  # as in a mirror whose largest files are absent
    assert llama_src.main([str(git_dir), "--rev", "HEAD", "--dest", str(tmp_path / "out")]) == 3
