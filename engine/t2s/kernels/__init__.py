"""Optional fused GPU kernels. Callers check :func:`triton_available` before importing a kernel module."""

from __future__ import annotations

import importlib.util
import os

import torch


def triton_available(device: torch.device) -> bool:
    """Triton kernels run on CUDA devices (and on the CPU only under TRITON_INTERPRET=1, for tests)."""
    if importlib.util.find_spec("triton") is None:
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
