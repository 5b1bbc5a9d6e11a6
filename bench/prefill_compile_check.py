"""Compile every prefill kernel for sm_90 on a machine without a GPU and report registers, stack
(spills) and whether the tensor-core path is wgmma (HGMMA) — catches kernels that only the real
compiler rejects (the interpreter accepts more) before a device run.

    python bench/prefill_compile_check.py          # ~2-4 min on 2 CPU cores

Needs the ptxas/cuobjdump that ship inside the triton wheel. Exit status 1 if any kernel fails.
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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


def check(name: str, fn, types: dict, consts: dict, num_warps: int, num_stages: int = 2) -> bool:
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
    print(f"ok   {name:34s} regs={regs:>4} stack={stack:>5} shared={k.metadata.shared:>6} "
          f"HGMMA={sass.count('HGMMA')} HMMA={sass.count('HMMA')}", flush=True)
    return True


def main() -> int:
    ok = True
    gemm = dict(p_x=BF16, p_w="*u8", p_y=F32, p_res=F32, M=I32, N=I32, K=I32, stride_x=I32, stride_w=I32, stride_y=I32,
                stride_res=I32)
    for wtype in (12, 13, 14, 8):
        for bm, bn, warps, stages in ((128, 128, 8, 3), (16, 64, 4, 4)):
            ok &= check(f"qgemm type={wtype} {bm}x{bn}", _qgemm_kernel, gemm,
                        dict(WTYPE=wtype, HAS_RES=True, BM=bm, BN=bn, BK=64, GROUP_M=8, DOT_BF16=True), warps, stages)
    ok &= check("qgemm bf16 128x128", _qgemm_kernel, {**gemm, "p_w": BF16},
                dict(WTYPE=30, HAS_RES=False, BM=128, BN=128, BK=64, GROUP_M=8, DOT_BF16=True), 8, 3)
    ok &= check("qgemm_swiglu Q4_K 128x64", _qgemm_swiglu_kernel,
                dict(p_x=BF16, p_wg="*u8", p_wu="*u8", p_y=BF16, M=I32, N=I32, K=I32, stride_x=I32, stride_wg=I32,
                     stride_wu=I32, stride_y=I32),
                dict(GTYPE=12, UTYPE=12, BM=128, BN=64, BK=64, GROUP_M=8, DOT_BF16=True), 8, 3)
    ok &= check("gather_rows Q6_K", _embed_kernel,
                dict(p_w="*u8", p_ids="*i32", p_y=F32, T=I32, V=I32, K=I32, stride_w=I32, stride_y=I32),
                dict(WTYPE=14, BT=16, BK=64, ALL_ROWS=False), 4)
    ok &= check("gdn_conv", _gdn_conv_kernel, dict(p_x=F32, p_state=F32, p_w=F32, p_y=F32, T=I32, C=I32, stride_x=I32,
                                                   stride_y=I32), dict(KW=4, BT=32, BC=128), 4)
    ok &= check("gdn_prep", _gdn_prep_kernel,
                dict(p_u=F32, p_alpha=F32, p_b=F32, p_ssm_a=F32, p_dt=F32, p_wout=F32, p_uout=F32, p_kdout=F32,
                     p_gam=F32, T=I32, stride_u=I32, stride_ab=I32, HK=I32, HV=I32),
                dict(DK=128, DV=128, BT=64, F32_PREC="tf32"), 8, 1)
    for bv in (32, 16):
        ok &= check(f"gdn_scan BV={bv}", _gdn_scan_kernel,
                    dict(p_wbuf=F32, p_ubuf=F32, p_kdbuf=F32, p_gam=F32, p_state=F32, p_h=F32, T=I32),
                    dict(DK=128, DV=128, BV=bv, BT=64, F32_PREC="tf32"), 8, 1)
    ok &= check("gdn_out BV=64", _gdn_out_kernel,
                dict(p_u=F32, p_dbuf=F32, p_gam=F32, p_h=F32, p_o=F32, T=I32, stride_u=I32, stride_o=I32, HK=I32,
                     scale="fp32"), dict(DK=128, DV=128, BV=64, BT=64, F32_PREC="tf32"), 8, 1)
    ok &= check("gated_norm", _gated_norm_kernel,
                dict(p_o=F32, p_z=BF16, p_w=F32, p_y=BF16, T=I32, HV=I32, stride_o=I32, stride_z=I32, stride_y=I32,
                     eps="fp32"), dict(DV=128, BT=16), 4)
    ok &= check("rmsnorm d=4096", _rmsnorm_kernel, dict(p_x=F32, p_w=F32, p_y=BF16, D=I32, stride_x=I32, stride_y=I32,
                                                       eps="fp32"), dict(BD=4096), 16)
    ok &= check("attn_prep", _attn_prep_kernel,
                dict(p_qg=F32, p_k=F32, p_v=F32, p_qn=F32, p_kn=F32, p_cos=F32, p_sin=F32, p_qout=BF16, p_kc=BF16,
                     p_vc=BF16, pos0=I32, HQ=I32, HKV=I32, stride_qg=I32, stride_k=I32, stride_v=I32, stride_qo_t=I32,
                     stride_cache_t=I32, eps="fp32"), dict(DH=256, HALF=32), 2)
    flash = dict(p_q=BF16, p_qg=F32, p_kc=BF16, p_vc=BF16, p_o=BF16, T=I32, pos0=I32, G=I32, stride_q_t=I32,
                 stride_qg_t=I32, stride_c_t=I32, stride_o_t=I32, scale_log2="fp32")
    for bv in (128, 256):
        ok &= check(f"flash_attn 64x64 BV={bv}", _flash_attn_kernel, flash,
                    dict(DH=256, BM=64, BN=64, BV=bv, DOT_BF16=True), 8, 2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
