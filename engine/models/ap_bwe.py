"""AP-BWE: the bandwidth-extension network the official code uses for v3's "super-sampling" (24 -> 48 kHz).

It works on a spectrogram's log amplitude and phase in parallel streams of 1-D ConvNeXt blocks that
exchange information before every block, then predicts the wide-band log amplitude (as a residual)
and the phase (from its real and imaginary parts). Parameter names follow the official checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class APBWEDims:
    """The architecture and STFT settings, read from the checkpoint's ``config.json``."""

    n_fft: int = 1024
    hop_size: int = 80
    win_size: int = 320
    hr_sampling_rate: int = 48000
    channels: int = 512  # ConvNeXt_channels
    layers: int = 8  # ConvNeXt_layers

    @classmethod
    def from_config(cls, config: dict) -> "APBWEDims":
        return cls(int(config["n_fft"]), int(config["hop_size"]), int(config["win_size"]),
                   int(config["hr_sampling_rate"]), int(config["ConvNeXt_channels"]), int(config["ConvNeXt_layers"]))


class ConvNeXtBlock(nn.Module):
    """Depthwise conv, LayerNorm over channels, a 3x pointwise MLP with GELU, a learned scale, residual."""

    def __init__(self, dim: int, scale: float) -> None:
        super().__init__()
        self.dwconv = nn.Conv1d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, dim * 3)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(dim * 3, dim)
        self.gamma = nn.Parameter(torch.full((dim,), scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, T)
        y = self.dwconv(x).transpose(1, 2)  # (B, T, C)
        y = self.gamma * self.pwconv2(self.act(self.pwconv1(self.norm(y))))
        return x + y.transpose(1, 2)


class APBWE(nn.Module):
    """(log amplitude, phase) of the narrow-band signal -> (log amplitude, phase) of the wide-band one."""

    def __init__(self, dims: APBWEDims) -> None:
        super().__init__()
        bins, ch = dims.n_fft // 2 + 1, dims.channels
        self.dims = dims
        self.conv_pre_mag = nn.Conv1d(bins, ch, 7, 1, padding=3)
        self.norm_pre_mag = nn.LayerNorm(ch, eps=1e-6)
        self.conv_pre_pha = nn.Conv1d(bins, ch, 7, 1, padding=3)
        self.norm_pre_pha = nn.LayerNorm(ch, eps=1e-6)
        self.convnext_mag = nn.ModuleList(ConvNeXtBlock(ch, 1 / dims.layers) for _ in range(dims.layers))
        self.convnext_pha = nn.ModuleList(ConvNeXtBlock(ch, 1 / dims.layers) for _ in range(dims.layers))
        self.norm_post_mag = nn.LayerNorm(ch, eps=1e-6)
        self.norm_post_pha = nn.LayerNorm(ch, eps=1e-6)
        self.linear_post_mag = nn.Linear(ch, bins)
        self.linear_post_pha_r = nn.Linear(ch, bins)
        self.linear_post_pha_i = nn.Linear(ch, bins)

    def forward(self, log_amp: torch.Tensor, phase: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # log_amp, phase: (B, bins, T)
        mag = self.norm_pre_mag(self.conv_pre_mag(log_amp).transpose(1, 2)).transpose(1, 2)  # (B, C, T)
        pha = self.norm_pre_pha(self.conv_pre_pha(phase).transpose(1, 2)).transpose(1, 2)
        for block_mag, block_pha in zip(self.convnext_mag, self.convnext_pha):
            mag = mag + pha
            pha = pha + mag
            mag, pha = block_mag(mag), block_pha(pha)
        wide_amp = log_amp + self.linear_post_mag(self.norm_post_mag(mag.transpose(1, 2))).transpose(1, 2)
        pha = self.norm_post_pha(pha.transpose(1, 2))  # (B, T, C)
        wide_phase = torch.atan2(self.linear_post_pha_i(pha), self.linear_post_pha_r(pha)).transpose(1, 2)
        return wide_amp, wide_phase
