"""Small Triton helpers shared by the kernels.

The Triton interpreter (CI, CPU) computes tl.dot on bf16 operands wrongly (numpy has no
bf16), so under the interpreter the bf16-rounded operands are multiplied in fp32 instead.
"""
import os

import triton
import triton.language as tl


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def rows_per_program() -> int:
    """Rows (tokens) one program of a row-wise kernel takes: one on the GPU; 16 under the CPU interpreter, which
    pays per program, not per element (CI time)."""
    return 16 if interpreting() else 1


def dot_flags() -> dict:
    """Launch kwargs for kernels that use `mma_bf16` / `mma_f32`."""
    gpu = not interpreting()
    return dict(DOT_BF16=gpu, F32_PREC="tf32" if gpu else "ieee")


@triton.jit
def mma_bf16(a, b, acc, DOT_BF16: tl.constexpr):
    """acc + a·b with a, b rounded to bf16 (tensor cores on the GPU)."""
    if DOT_BF16:
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
    else:
        return tl.dot(a.to(tl.bfloat16).to(tl.float32), b.to(tl.bfloat16).to(tl.float32), acc, input_precision="ieee")


@triton.jit
def mma_f32(a, b, acc, F32_PREC: tl.constexpr):
    """acc + a·b on fp32 operands (tf32 tensor cores on the GPU, exact fp32 in the interpreter)."""
    return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision=F32_PREC)


@triton.jit
def gdn_log_decay(a, dt_bias, ssm_a):
    """Gated DeltaNet log-decay g = ssm_a * softplus(a + dt_bias) <= 0 (§5.4; ssm_a = -exp(A_log)),
    with the softplus linear above 20 so exp never overflows."""
    x = a + dt_bias
    return ssm_a * tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
