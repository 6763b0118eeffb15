"""Conditional flow matching sampler of v3/v4 (official ``GPT_SoVITS/module/models.py``, ``CFM.inference``).

The initial noise is an argument: a tensor, or a callable ``noise(shape, dtype, device)``, so a run
can replay recorded noise. Classifier-free guidance is not implemented: the official pipeline
always calls the sampler with ``inference_cfg_rate=0``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from engine.models.dit import DiT

NoiseSource = Callable[[tuple[int, ...], torch.dtype, torch.device], torch.Tensor]


def gaussian_noise(generator: torch.Generator | None = None) -> NoiseSource:
    """The default noise: ``torch.randn`` (optionally from a seeded generator)."""

    def draw(shape, dtype, device):
        return torch.randn(shape, generator=generator, dtype=dtype, device=device)

    return draw


class CFM(nn.Module):
    """Holds the DiT as ``estimator`` (state-dict prefix ``cfm.estimator.``) and runs Euler sampling."""

    def __init__(self, estimator: DiT):
        super().__init__()
        self.estimator = estimator
        self.in_channels = estimator.dims.mel_dim

    @torch.inference_mode()
    def sample(
        self,
        features: torch.Tensor,  # (B, text_dim, T) prompt features ++ target features
        prompt: torch.Tensor,  # (B or 1, mel, T_p) normalised reference mel, T_p <= T
        steps: int,
        noise: torch.Tensor | NoiseSource | None = None,  # (B, mel, T) or a source; None = torch.randn
        temperature: float = 1.0,
        lengths: torch.Tensor | None = None,  # (B,) valid frames; None = all
    ) -> torch.Tensor:  # (B, mel, T); the first T_p frames are zero
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        b, _, n = features.shape
        shape = (b, self.in_channels, n)
        if noise is None:
            noise = gaussian_noise()
        x = noise if isinstance(noise, torch.Tensor) else noise(shape, features.dtype, features.device)
        if tuple(x.shape) != shape:
            raise ValueError(f"CFM noise has shape {tuple(x.shape)}, expected {shape}")
        x = x.to(features.dtype) * temperature
        t_p = prompt.shape[-1]
        cond = torch.zeros_like(x)
        cond[..., :t_p] = prompt[..., :t_p]
        x[..., :t_p] = 0
        d = 1 / steps
        condition = self.estimator.condition(features, torch.ones(b, device=x.device, dtype=x.dtype) * d)
        t = 0
        for _ in range(steps):
            t_tensor = torch.ones(b, device=x.device, dtype=x.dtype) * t
            v = self.estimator(x, cond, t_tensor, condition, lengths)
            x = x + d * v
            t = t + d
            x[:, :, :t_p] = 0
        return x
