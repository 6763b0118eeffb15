"""The Triton kernel of :func:`engine.models.leaky_mask.leaky_masked` (CUDA; also under ``TRITON_INTERPRET=1``).

Import this module only where Triton is available (it imports triton at import time).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024  # time steps per program


@triton.jit
def _leaky_masked_kernel(x_ptr, mask_ptr, out_ptr, C, T, slope, BLOCK_T: tl.constexpr):
    row = tl.program_id(0)  # b * C + c
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    ok = t < T
    b = row // C
    x = tl.load(x_ptr + row.to(tl.int64) * T + t, mask=ok, other=0.0).to(tl.float32)
    keep = tl.load(mask_ptr + b.to(tl.int64) * T + t, mask=ok, other=0.0) != 0
    y = tl.where(x > 0, x, x * slope)
    y = tl.where(keep, y, 0.0)
    tl.store(out_ptr + row.to(tl.int64) * T + t, y.to(out_ptr.dtype.element_ty), mask=ok)


def leaky_masked(x: torch.Tensor, slope: float, mask: torch.Tensor) -> torch.Tensor:
    """``x`` (B, C, T) contiguous, ``mask`` (B, 1, T) -> ``where(mask != 0, leaky_relu(x, slope), 0)``."""
    b, c, t = x.shape
    if mask.shape != (b, 1, t):
        raise ValueError(f"mask has shape {tuple(mask.shape)}, expected {(b, 1, t)}")
    m = mask.reshape(b, t).contiguous()
    out = torch.empty_like(x)
    if x.numel():
        _leaky_masked_kernel[(b * c, triton.cdiv(t, BLOCK))](x, m, out, c, t, float(slope), BLOCK_T=BLOCK)
    return out
