"""Compile every prefill kernel for sm_90 on a machine without a GPU and report registers, stack
(spills) and whether the tensor-core path is wgmma (HGMMA) — catches kernels that only the real
compiler rejects (the interpreter accepts more) before a device run.

    python bench/profiling/prefill_compile_check.py          # ~2-4 min on 2 CPU cores

Covers the constexprs of the 0.8B, 4B and 9B shapes and each launcher's warps/stages (Triton's default
3 stages where a launcher passes none). Needs the ptxas/cuobjdump that ship inside the triton wheel.
Exit status 1 if any kernel fails to compile or needs more than 232448 B of shared memory (H200).
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from runtime.kernels.attn_prep.kernel import _attn_prep_kernel  # noqa: E402
from runtime.kernels.flash_attn.kernel import _flash_attn_kernel  # noqa: E402
from runtime.kernels.gated_norm.kernel import _gated_norm_kernel  # noqa: E402
from runtime.kernels.gdn_chunk.kernel import _gdn_out_kernel, _gdn_prep_kernel, _gdn_scan_kernel  # noqa: E402
from runtime.kernels.gdn_conv.kernel import _gdn_conv_kernel  # noqa: E402
from runtime.kernels.qgemm.gather import _embed_kernel  # noqa: E402
from runtime.kernels.qgemm.kernel import _qgemm_kernel, _qgemm_swiglu_kernel  # noqa: E402
from runtime.kernels.rmsnorm.kernel import _rmsnorm_kernel  # noqa: E402

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
F32, BF16, I32 = "*fp32", "*bf16", "i32"


def _sig(fn, types: dict) -> dict:
    return {name: types.get(name, "constexpr") for name in fn.arg_names}


SMEM_LIMIT = 232448  # max dynamic shared memory per block on sm_90 (H200)
DEFAULT_STAGES = 3  # what Triton uses for a launch that does not pass num_stages
_seen: set = set()


def check(name: str, fn, types: dict, consts: dict, num_warps: int, num_stages: int = DEFAULT_STAGES) -> bool:
    """Compile like the launcher does (same constexprs, warps, stages); fail on errors, spills or
    shared memory above SMEM_LIMIT."""
    key = (fn.__name__, tuple(sorted(consts.items())), num_warps, num_stages)
    if key in _seen:
        return True
    _seen.add(key)
    try:
        k = triton.compile(ASTSource(fn=fn, signature=_sig(fn, types), constexprs=consts),
                           target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps, num_stages=num_stages))
    except Exception as e:  # noqa: BLE001
        print(f"FAIL {name}: {str(e)[-600:]}", flush=True)
        return False
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        res = subprocess.run([str(BIN / "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([str(BIN / "cuobjdump"), "-sass", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+).*?STACK:(\d+)", res, re.S)
    regs, stack = (m.group(1), m.group(2)) if m else ("?", "?")
    shared = int(k.metadata.shared)
    ok = shared <= SMEM_LIMIT
    print(f"{'ok  ' if ok else 'FAIL'} {name:40s} w={num_warps} s={num_stages} regs={regs:>4} stack={stack:>5} "
          f"shared={shared:>6}{'' if ok else f' > {SMEM_LIMIT}'} HGMMA={sass.count('HGMMA')} HMMA={sass.count('HMMA')}",
          flush=True)
    return ok


def main() -> int:
    from runtime.config import SHAPES
    from runtime.kernels.gdn_chunk.kernel import out_config, prep_config, scan_config
    from runtime.kernels.qgemm.kernel import pick_config

    ok = True
    gemm = dict(p_x=BF16, p_w="*u8", p_y=F32, p_res=F32, M=I32, N=I32, K=I32, stride_x=I32, stride_w=I32, stride_y=I32,
                stride_res=I32)
    swiglu = dict(p_x=BF16, p_wg="*u8", p_wu="*u8", p_y=BF16, M=I32, N=I32, K=I32, stride_x=I32, stride_wg=I32,
                  stride_wu=I32, stride_y=I32)
    for m in (1, 64, 256, 512):  # one M per shape class of pick_config
        cfg = pick_config(m, 4096)
        bm, bn, gm, w, st = cfg["BM"], cfg["BN"], cfg["GROUP_M"], cfg["num_warps"], cfg["num_stages"]
        for wtype in (12, 13, 14, 8):
            ok &= check(f"qgemm type={wtype} {bm}x{bn}", _qgemm_kernel, gemm,
                        dict(WTYPE=wtype, HAS_RES=True, BM=bm, BN=bn, BK=64, GROUP_M=gm, DOT_BF16=True), w, st)
        ok &= check(f"qgemm_swiglu Q4_K {bm}x{min(bn, 64)}", _qgemm_swiglu_kernel, swiglu,
                    dict(GTYPE=12, UTYPE=12, BM=bm, BN=min(bn, 64), BK=64, GROUP_M=gm, DOT_BF16=True), w, st)
        ok &= check(f"qgemm_swiglu Q4_K/Q6_K {bm}x{min(bn, 64)}", _qgemm_swiglu_kernel, swiglu,
                    dict(GTYPE=12, UTYPE=14, BM=bm, BN=min(bn, 64), BK=64, GROUP_M=gm, DOT_BF16=True), w, st)
    ok &= check("qgemm bf16 128x128", _qgemm_kernel, {**gemm, "p_w": BF16},
                dict(WTYPE=30, HAS_RES=False, BM=128, BN=128, BK=64, GROUP_M=8, DOT_BF16=True), 8, 3)
    for wtype in (12, 13, 14, 8):
        for bt, all_rows in ((16, False), (32, True)):
            ok &= check(f"gather_rows type={wtype} BT={bt}", _embed_kernel,
                        dict(p_w="*u8", p_ids="*i32", p_y=BF16 if all_rows else F32, T=I32, V=I32, K=I32, stride_w=I32,
                             stride_y=I32), dict(WTYPE=wtype, BT=bt, BK=64, ALL_ROWS=all_rows), 4)
    ok &= check("gdn_conv", _gdn_conv_kernel, dict(p_x=F32, p_state=F32, p_w=F32, p_y=F32, T=I32, C=I32, stride_x=I32,
                                                   stride_y=I32), dict(KW=4, BT=32, BC=128), 4)
    for shape in ("0.8b", "4b", "9b"):
        cfg = SHAPES[shape]
        dk = dv = cfg.ssm_head_dim
        print(f"-- {shape}: Hv={cfg.n_v_head} d_model={cfg.d_model} Dh={cfg.head_dim}", flush=True)
        pc = prep_config()
        ok &= check("gdn_prep", _gdn_prep_kernel,
                    dict(p_u=F32, p_alpha=F32, p_b=F32, p_ssm_a=F32, p_dt=F32, p_wout=F32, p_uout=F32, p_kdout=F32,
                         p_gam=F32, T=I32, stride_u=I32, stride_ab=I32, HK=I32, HV=I32),
                    dict(DK=dk, DV=dv, BT=64, F32_PREC="tf32", TRIM=False), pc["num_warps"], pc["num_stages"])
        sc = scan_config(cfg.n_v_head, dv)
        ok &= check(f"gdn_scan BV={sc['BV']}", _gdn_scan_kernel,
                    dict(p_wbuf=F32, p_ubuf=F32, p_kdbuf=F32, p_gam=F32, p_state=F32, p_h=F32, T=I32),
                    dict(DK=dk, DV=dv, BV=sc["BV"], BT=64, F32_PREC="tf32"), sc["num_warps"], sc["num_stages"])
        oc = out_config(dv)
        ok &= check(f"gdn_out BV={oc['BV']}", _gdn_out_kernel,
                    dict(p_u=F32, p_dbuf=F32, p_gam=F32, p_h=F32, p_o=F32, T=I32, stride_u=I32, stride_o=I32, HK=I32,
                         scale="fp32"), dict(DK=dk, DV=dv, BV=oc["BV"], BT=64, F32_PREC="tf32"), oc["num_warps"],
                    oc["num_stages"])
        ok &= check("gated_norm", _gated_norm_kernel,
                    dict(p_o=F32, p_z=BF16, p_w=F32, p_y=BF16, T=I32, HV=I32, stride_o=I32, stride_z=I32, stride_y=I32,
                         eps="fp32"), dict(DV=dv, BT=16), 4)
        bd = triton.next_power_of_2(cfg.d_model)  # rmsnorm and attn_prep as the GPU launches them: one row (BT=1)
        ok &= check(f"rmsnorm BD={bd}", _rmsnorm_kernel, dict(p_x=F32, p_w=F32, p_y=BF16, T=I32, D=I32, stride_x=I32,
                                                              stride_y=I32, eps="fp32"),
                    dict(BT=1, BD=bd), min(16, max(1, bd // 256)))
        ok &= check("attn_prep", _attn_prep_kernel,
                    dict(p_qg=F32, p_k=F32, p_v=F32, p_qn=F32, p_kn=F32, p_cos=F32, p_sin=F32, p_qout=BF16, p_kc=BF16,
                         p_vc=BF16, pos0=I32, T=I32, HQ=I32, HKV=I32, stride_qg=I32, stride_k=I32, stride_v=I32,
                         stride_qo_t=I32, stride_cache_t=I32, eps="fp32"),
                    dict(DH=cfg.head_dim, HALF=cfg.rope_dims // 2, BT=1), 2)
        flash = dict(p_q=BF16, p_qg=F32, p_kc=BF16, p_vc=BF16, p_o=BF16, T=I32, pos0=I32, G=I32, stride_q_t=I32,
                     stride_qg_t=I32, stride_c_t=I32, stride_o_t=I32, scale_log2="fp32")
        ok &= check(f"flash_attn 64x64 BV={min(cfg.head_dim, 128)}", _flash_attn_kernel, flash,
                    dict(DH=cfg.head_dim, BM=64, BN=64, BV=min(cfg.head_dim, 128), DOT_BF16=True), 8, 2)
    print("ALL OK" if ok else "SOME KERNELS FAIL", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
