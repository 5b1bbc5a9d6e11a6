"""Programmatic dependent launch (Hopper): shared by the decode kernels.

A kernel launched with PDL may start while the previous kernel in the stream finishes; it calls
gdc_launch_dependents() early (so the next kernel can be scheduled in turn), does work that does
not depend on the previous kernel (e.g. prefetch its weights), and gdc_wait()s before it reads
anything the previous kernel wrote or writes anything it reads. The interpreter has no grid
dependency control, so PDL is CUDA-only.
"""
from __future__ import annotations

import triton

try:  # Triton >= 3.4
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    HAS_GDC = True
except ImportError:  # pragma: no cover - older Triton: asking for PDL is an error
    gdc_launch_dependents = gdc_wait = None
    HAS_GDC = False


def pdl_launch(pdl: bool, device, who: str) -> tuple[bool, dict]:
    """(PDL constexpr, launch kwargs) for a kernel launch on `device`; CPU (interpreter) never uses PDL."""
    on = bool(pdl) and getattr(device, "type", str(device)) != "cpu"
    if on and not HAS_GDC:
        raise ValueError(f"{who}: pdl needs triton.language.extra.cuda.gdc_wait (Triton >= 3.4), have {triton.__version__}")
    return on, ({"launch_pdl": True} if on else {})


__all__ = ["HAS_GDC", "gdc_launch_dependents", "gdc_wait", "pdl_launch"]
