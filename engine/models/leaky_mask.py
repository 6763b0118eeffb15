"""``where(mask, leaky_relu(x), 0)`` for the masked HiFi-GAN decoder of a padded batch (the input of every conv).

In PyTorch it is two passes over an audio-rate tensor, and the second broadcasts the mask (B, 1, T) over the
channels, which keeps it off the vectorised elementwise path: on an H200 those multiplies were the largest
share of a batched chunk decode. On CUDA with Triton it is one pass (:mod:`engine.models.leaky_mask_triton`),
reading the mask once per time step. The numbers are the same: the slope is applied in float32 as PyTorch does,
and masked positions are exactly zero.
"""

from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F

from engine.t2s.kernels import triton_available


def leaky_masked(x: torch.Tensor, slope: float, mask: torch.Tensor | None) -> torch.Tensor:
    """``leaky_relu(x, slope)`` of ``x`` (B, C, T), zero where ``mask`` (B, 1, T) is 0 (None: no mask)."""
    if mask is None:
        return F.leaky_relu(x, slope)
    if x.is_contiguous() and triton_available(x.device):
        return importlib.import_module("engine.models.leaky_mask_triton").leaky_masked(x, slope, mask)
    return F.leaky_relu(x, slope) * mask
