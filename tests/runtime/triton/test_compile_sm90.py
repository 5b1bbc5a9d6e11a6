"""Every kernel the decode step launches, with the constexprs it launches them with at the 0.8B
and 9B shapes, compiles for sm_90 (Hopper) without a GPU. The interpreter runs the same source
but skips Triton's type checks, layout passes and ptxas; this catches what it lets through.

Runs in a subprocess with TRITON_INTERPRET unset (the conftest sets it for this process)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SHAPES = "0.8b,4b,9b"


PREFILL_ONLY_PACKAGES = ["attn_prep", "flash_attn", "gated_norm", "gdn_chunk", "gdn_conv", "qgemm", "rmsnorm"]
# The qwen35moe path's kernels: the dense decode step checked here never launches them; the MoE decode step's
# are compiled below (test_moe_decode_kernels_compile_for_sm90), its prefill's ran compiled in bench/runtime/moe.py's
# receipts; under the interpreter they are tested against their torch twins.
MOE_PACKAGES = ["moe_experts", "moe_route"]


def _prefill_only_kernels() -> set[str]:
    """Kernels of the prefill and MoE paths, which the dense decode step rightly never launches."""
    import importlib

    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    names = set()
    for pkg in PREFILL_ONLY_PACKAGES + MOE_PACKAGES:
        mod = importlib.import_module(f"runtime.kernels.{pkg}.kernel")
        names |= {n for n, obj in vars(mod).items() if isinstance(obj, (JITFunction, InterpretedFunction))}
    return names


@pytest.mark.slow
def test_decode_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # the 3.6 default; silences 3.9's warning
    # The default launches and the first two of the bench's variant sets, which launch the split-GDN kernels
    # no default does (17 s cold here; all ten sets: 50 s of CI). The bench reports the others' errors itself.
    r = subprocess.run([sys.executable, "-m", "runtime.triton.launches", "--shapes", SHAPES, "--json",
                        "--variant-sets", "2"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"no summary (rc {r.returncode}): {r.stderr[-3000:]}"
    summary = json.loads(lines[-1])
    failed = [c for c in summary["compiled"] if c["error"]]
    assert not failed, "\n\n".join(f"{c['kernel']} {c['constexprs']} {c['options']}:\n{c['error']}" for c in failed)
    assert r.returncode == 0, r.stderr[-3000:]
    missing = set(summary["kernels_defined"]) - set(summary["kernels_launched"]) - _prefill_only_kernels()
    assert not missing, f"kernels the decode step never launches (not compile-checked): {sorted(missing)}"
    for shape in SHAPES.split(","):
        assert any(shape in c["shapes"] for c in summary["compiled"]), shape
    # The default engine's launches must not spill; the bench's opt-in variants (tagged "+variants" only)
    # are experiments whose spills the bench weighs against their speed.
    measured = [c for c in summary["compiled"] if c["resources"]
                and not all(tag.endswith("+variants") for tag in c["shapes"])]
    if measured:  # Triton ships cuobjdump with its ptxas; no spills to local memory in a default launch
        spills = [f"{c['kernel']} {c['constexprs']} {c['options']}: {c['resources']}" for c in measured
                  if c["resources"]["local_bytes"] or c["resources"]["stack_bytes"]]
        assert not spills, "register spills:\n" + "\n".join(spills)


MOE_SCRIPT = """
import json, sys
from runtime.config import SHAPES
from runtime.kernels.moe_experts import ExpertTile
from runtime.triton.launches import compile_all, record_decode_launches, unique_launches
launches = []
for name in sys.argv[1].split(","):
    tile = ExpertTile.parse(name) if name != "default" else None
    for launch in record_decode_launches(SHAPES["35b-a3b"], **({"expert_tile": tile} if tile else {})):
        launch.tags.append(name)
        launches.append(launch)
moe = [x for x in unique_launches(launches) if x.fn.fn.__module__.startswith(("runtime.kernels.moe_experts",
                                                                              "runtime.kernels.moe_route"))]
out = [{"kernel": lc.kernel, "tags": lc.tags, "error": err, "resources": res}
       for lc, err, _, res in compile_all(moe, 2, 90)]
print(json.dumps(out))
"""


@pytest.mark.slow
def test_moe_decode_kernels_compile_for_sm90():
    """The 35B-A3B decode step's routing and expert launches, on the default (int8 x, shared expert folded in), on
    the tile path and on the dense GEMV paths, compile for sm_90 without spills (the interpreter lets through what
    ptxas would refuse)."""
    compiled = _compile_script(MOE_SCRIPT, "default,s16d16w4split,s16d16w4split-x8q6-shared,s16d16w4-words-shared")
    kernels = {c["kernel"] for c in compiled}
    assert {"_route_kernel", "_swiglu_gemv_kernel", "_down_part_kernel", "_down_sum_kernel", "_swiglu_dot_kernel",
            "_down_part_dot_kernel", "_down_dot_kernel"} <= kernels, kernels
    _assert_compiled_without_spills(compiled)


def _compile_script(script: str, arg: str) -> list[dict]:
    """Run a compile script (its last stdout line: a JSON list of kernel, tags, error, resources) with the
    interpreter off."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    r = subprocess.run([sys.executable, "-c", script, arg], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=600)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("[")]
    assert lines, f"no summary (rc {r.returncode}): {r.stderr[-3000:]}"
    return json.loads(lines[-1])


def _assert_compiled_without_spills(compiled: list[dict]) -> None:
    failed = [f"{c['kernel']} {c['tags']}:\n{c['error']}" for c in compiled if c["error"]]
    assert not failed, "\n\n".join(failed)
    spills = [c for c in compiled if c["resources"] and (c["resources"]["local_bytes"] or c["resources"]["stack_bytes"])]
    assert not spills, spills


GROUPED_SCRIPT = """
import json, sys, torch
from bench.profiling.expert_sweep import SHAPES
from runtime.gguf import BLOCK, GGMLType
from runtime.kernels.moe_experts import ExpertSort, GroupedTile, grouped_experts
from runtime.triton.launches import META, _Recorder, compile_all, unique_launches

s, t = SHAPES["35b-a3b"], 512
def stack(qtype, rows, cols):
    per, nb = BLOCK[qtype]
    return torch.empty(s["experts"] * rows, cols // per * nb, dtype=torch.uint8, device=META)
launches = []
for name in sys.argv[1].split(","):
    tile = GroupedTile.parse(name)
    rows = -(-(t * s["k"] + s["experts"] * (tile.bm - 1)) // tile.bm) * tile.bm  # sort_by_expert's static bound
    sort = ExpertSort(torch.empty(rows, dtype=torch.int32, device=META),
                      torch.empty(rows // tile.bm, dtype=torch.int32, device=META), tile.bm)
    rec = _Recorder()
    rec.tag = name
    with rec:
        grouped_experts(torch.empty(t, s["d"], dtype=torch.bfloat16, device=META),
                        torch.empty(t, s["k"], dtype=torch.int32, device=META), torch.empty(t, s["k"], device=META),
                        stack(GGMLType.Q4_K, s["ff"], s["d"]), GGMLType.Q4_K, stack(GGMLType.Q4_K, s["ff"], s["d"]),
                        GGMLType.Q4_K, stack(GGMLType.Q6_K, s["d"], s["ff"]), GGMLType.Q6_K, s["experts"], s["ff"],
                        sort=sort, tile=tile)
    launches += rec.launches
out = [{"kernel": lc.kernel, "tags": lc.tags, "error": err, "resources": res}
       for lc, err, _, res in compile_all(unique_launches(launches), 2, 90)]
print(json.dumps(out))
"""


@pytest.mark.slow
def test_grouped_sweep_tiles_compile_for_sm90_without_spills():
    """The MoE prefill's grouped GEMMs at the 35B-A3B's shapes, with every tile bench/profiling/grouped_sweep.py
    times by default (README: they compile without spills), the engine's default among them."""
    from bench.profiling.grouped_sweep import DEFAULT_TILES

    compiled = _compile_script(GROUPED_SCRIPT, DEFAULT_TILES)
    tiles = DEFAULT_TILES.split(",")
    assert {(c["kernel"], c["tags"][0]) for c in compiled} >= {(k, t) for t in tiles for k in
                                                              ("_grouped_swiglu_kernel", "_grouped_down_kernel")}
    _assert_compiled_without_spills(compiled)


ROWWISE_SCRIPT = """
import json, sys, torch
from runtime.config import SHAPES
from runtime.kernels.attn_prep import attn_prep
from runtime.kernels.rmsnorm import rmsnorm
from runtime.triton.launches import META, _Recorder, compile_all, unique_launches

launches, t = [], 512
for name in sys.argv[1].split(","):
    cfg = SHAPES[name]
    e = lambda *shape, dtype=torch.float32: torch.empty(*shape, dtype=dtype, device=META)
    hq, hkv, dh, half = cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.rope_dims // 2
    with _Recorder() as rec:
        rmsnorm(e(t, cfg.d_model), e(cfg.d_model), 1e-6)
        attn_prep(e(t, 2 * hq * dh), e(t, hkv * dh), e(t, hkv * dh), e(dh), e(dh), e(t, half), e(t, half),
                  e(t, hkv, dh, dtype=torch.bfloat16), e(t, hkv, dh, dtype=torch.bfloat16), 0, 1e-6)
    launches += rec.launches
out = [{"kernel": lc.kernel, "tags": [str(lc.constexprs)], "error": err, "resources": res}
       for lc, err, _, res in compile_all(unique_launches(launches), 2, 90)]
print(json.dumps(out))
"""


def test_rowwise_prefill_kernels_compile_for_sm90():
    """rmsnorm and attn_prep take blocks of rows; the GPU launches one row a program (16 under the interpreter, which
    the other tests run): that launch, as the wrappers make it at the 0.8B and 9B shapes, compiles without spills."""
    compiled = _compile_script(ROWWISE_SCRIPT, "0.8b,9b")
    assert {c["kernel"] for c in compiled} == {"_rmsnorm_kernel", "_attn_prep_kernel"}, compiled
    assert all("'BT': 1" in c["tags"][0] for c in compiled), [c["tags"] for c in compiled]
    _assert_compiled_without_spills(compiled)
