"""Put a pruned llama.cpp source tree into an ignored folder for the GPU box (never committed).

    python3 bench/device/llama_src.py GIT_DIR [--rev 3f545be] [--dest .llama]

GIT_DIR is a bare mirror (the search tool's `fetch github:ngxson/llama.cpp`, whose commit 3f545be has
`qwen35`/`qwen35moe`). Only what a CUDA build of llama-bench reads is written: the top CMake files,
cmake/, common/, ggml/ without the other GPU backends, include/, src/, vendor/, tools/llama-bench (with a
tools/CMakeLists.txt that names only it) and the licences; configure with LLAMA_BUILD_{TESTS,EXAMPLES,SERVER,APP}=OFF; the folder is added to .git/info/exclude so it travels only by `carry`. Blobs the mirror
lacks (its largest files may be absent) are listed and skipped; the build needs none of them.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KEEP = ("CMakeLists.txt", "LICENSE", "cmake/", "common/", "ggml/", "include/", "src/", "vendor/", "licenses/",
        "tools/llama-bench/")
TOOLS_CMAKE = "# pruned by tokengate's bench/device/llama_src.py: only llama-bench\nadd_subdirectory(llama-bench)\n"
DROP = tuple(f"ggml/src/ggml-{b}/" for b in ("vulkan", "sycl", "metal", "opencl", "cann", "musa", "hip", "kompute",
                                               "webgpu", "zdnn", "zendnn", "hexagon", "openvino", "virtgpu"))
LIMIT = 40 << 20  # the carried tree's share (the kit and the repository take the rest of 64 MiB)


def wanted(path: str) -> bool:
    return any(path == k or path.startswith(k) for k in KEEP) and not path.startswith(DROP)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("git_dir")
    ap.add_argument("--rev", default="3f545be")
    ap.add_argument("--dest", default=str(ROOT / ".llama"))
    args = ap.parse_args(argv)
    git = ["git", "--git-dir", args.git_dir]
    listing = subprocess.run([*git, "ls-tree", "-r", "-z", args.rev], check=True, capture_output=True).stdout
    entries = []
    for item in listing.split(b"\0"):
        if not item:
            continue
        meta, path = item.split(b"\t", 1)
        mode, kind, sha = meta.split()
        if kind == b"blob" and wanted(path.decode()):
            entries.append((path.decode(), sha.decode(), mode == b"100755"))
    dest = Path(args.dest)
    batch = subprocess.Popen([*git, "cat-file", "--batch"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    missing, total = [], 0
    for path, sha, executable in entries:
        batch.stdin.write(sha.encode() + b"\n")
        batch.stdin.flush()
        head = batch.stdout.readline().split()
        if len(head) < 3 or head[1] != b"blob":
            missing.append(path)
            continue
        data = batch.stdout.read(int(head[2]))
        batch.stdout.read(1)  # the newline after each object
        out = dest / path
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
        if executable:
            out.chmod(0o755)
        total += len(data)
    batch.stdin.close()
    batch.wait()
    (dest / "tools" / "CMakeLists.txt").write_text(TOOLS_CMAKE)  # the full one names every tool
    exclude = ROOT / ".git" / "info" / "exclude"
    line = f"/{dest.resolve().relative_to(ROOT)}/" if dest.resolve().is_relative_to(ROOT) else None
    if line and line not in (exclude.read_text().splitlines() if exclude.exists() else []):
        with exclude.open("a") as f:
            f.write(line + "\n")
    print(f"{len(entries) - len(missing)} files, {total / 2**20:.1f} MiB into {dest}; missing: {missing[:5] or 'none'}")
    if total > LIMIT:
        print(f"over the {LIMIT >> 20} MiB share of a device call's carry", file=sys.stderr)
        return 1
    return 0 if not missing else 3


if __name__ == "__main__":
    sys.exit(main())
