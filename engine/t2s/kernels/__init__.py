"""Optional fused GPU kernels. :func:`choose_attention` decides, once per model, whether they run."""

from __future__ import annotations

import importlib.util
import logging
import os

import torch

log = logging.getLogger(__name__)

ATTENTION_CHOICES = ("auto", "triton", "matmul", "sdpa")
# Tile limits of the Triton step kernels (widths are padded to the next power of two): the attention kernel
# holds SPLIT x head-width values, the GEMV a few rows x input width.
MAX_TRITON_HEAD_DIM = 256
MAX_TRITON_GEMV_K = 16384


def triton_available(device: torch.device) -> bool:
    """Triton kernels run on CUDA devices (and on the CPU only under TRITON_INTERPRET=1, for tests)."""
    if importlib.util.find_spec("triton") is None:
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def triton_shape_problem(hidden_dim: int, n_head: int, ffn_dim: int) -> str | None:
    """Why the Triton step kernels cannot run a model of these widths, or None when they can (any width
    within the tile limits: non-powers of two are padded and masked)."""
    if n_head <= 0 or hidden_dim % n_head:
        return f"model width {hidden_dim} is not a multiple of the head count {n_head}"
    head_dim = hidden_dim // n_head
    if _next_pow2(head_dim) > MAX_TRITON_HEAD_DIM:
        return f"head width {head_dim} pads to {_next_pow2(head_dim)} > {MAX_TRITON_HEAD_DIM}"
    widest = max(hidden_dim, ffn_dim)
    if _next_pow2(widest) > MAX_TRITON_GEMV_K:
        return f"layer input width {widest} pads to {_next_pow2(widest)} > {MAX_TRITON_GEMV_K}"
    return None


def choose_attention(requested: str, device: torch.device, hidden_dim: int, n_head: int, ffn_dim: int) -> str:
    """The decode-step implementation for one model: "triton", "matmul" or "sdpa".

    "auto" takes the Triton kernels where they run (CUDA, or the interpreter) and fit the model's shape,
    else "sdpa"; a model they do not fit is logged once here. An explicit "triton" that cannot run raises.
    """
    if requested not in ATTENTION_CHOICES:
        raise ValueError(f"attention must be auto, triton, matmul or sdpa, not {requested!r}")
    if requested in ("matmul", "sdpa"):
        return requested
    problem = triton_shape_problem(hidden_dim, n_head, ffn_dim)
    if requested == "triton":
        if problem is not None:
            raise ValueError(f"attention='triton' cannot run this model: {problem}; use 'auto' or 'sdpa'")
        return "triton"
    if not triton_available(device):
        return "sdpa"
    if problem is not None:
        log.info("T2S decode: stock PyTorch step instead of the Triton kernels (%s)", problem)
        return "sdpa"
    return "triton"
