"""Device-side greedy argmax over the logits in two stages (blocks, then one program over the blocks).

Ties go to the lowest index, as torch.argmax. Stage 2 writes the token id into a device int32
buffer (the next decode step's input) and optionally advances the device position by one.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..pdl import gdc_launch_dependents, gdc_wait, pdl_launch


@triton.jit
def _argmax_stage1(p_logits, p_bmax, p_bidx, n, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    i_b = tl.program_id(0)
    offs = i_b * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(p_logits + offs, mask=offs < n, other=float("-inf"))
    m = tl.max(x, axis=0)
    idx = tl.min(tl.where(x == m, offs, n), axis=0)  # first index holding the max
    tl.store(p_bmax + i_b, m)
    tl.store(p_bidx + i_b, idx)


@triton.jit
def _argmax_stage2(p_bmax, p_bidx, p_token, p_pos, n_blocks, ADVANCE: tl.constexpr, NB: tl.constexpr,
                   PDL: tl.constexpr = False):
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    offs = tl.arange(0, NB)
    mask = offs < n_blocks
    m = tl.load(p_bmax + offs, mask=mask, other=float("-inf"))
    idx = tl.load(p_bidx + offs, mask=mask, other=2147483647)
    best = tl.max(m, axis=0)
    tl.store(p_token, tl.min(tl.where(m == best, idx, 2147483647), axis=0))
    if ADVANCE:
        tl.store(p_pos, tl.load(p_pos) + 1)


class ArgmaxWorkspace:
    def __init__(self, n: int, device, block: int = 4096):
        self.n, self.block = n, block
        self.n_blocks = triton.cdiv(n, block)
        self.bmax = torch.empty(self.n_blocks, dtype=torch.float32, device=device)
        self.bidx = torch.empty(self.n_blocks, dtype=torch.int32, device=device)


def argmax_to(logits: torch.Tensor, token: torch.Tensor, ws: ArgmaxWorkspace, pos: torch.Tensor | None = None,
              pdl: bool = False) -> torch.Tensor:
    """token[0] = argmax(logits) on the device; if `pos` is given, pos[0] += 1 afterwards."""
    if logits.dim() != 1 or logits.shape[0] != ws.n or logits.dtype != torch.float32:
        raise ValueError(f"argmax_to: logits must be fp32 [{ws.n}], got {tuple(logits.shape)} {logits.dtype}")
    if token.dtype != torch.int32 or token.numel() < 1:
        raise ValueError("argmax_to: token must be an int32 tensor")
    pdl, pkw = pdl_launch(pdl, logits.device, "argmax_to")
    _argmax_stage1[(ws.n_blocks,)](logits, ws.bmax, ws.bidx, ws.n, BLOCK=ws.block, PDL=pdl, **pkw)
    _argmax_stage2[(1,)](ws.bmax, ws.bidx, token, pos if pos is not None else token, ws.n_blocks,
                         ADVANCE=pos is not None, NB=triton.next_power_of_2(ws.n_blocks), PDL=pdl, **pkw)
    return token
