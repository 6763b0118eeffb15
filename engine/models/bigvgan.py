"""BigVGAN-v2 generator (the v3 vocoder, official ``GPT_SoVITS/BigVGAN/bigvgan.py``), with weight norm already folded.

Anti-aliased periodic activations: each Snake/SnakeBeta runs at twice the sample rate between a
Kaiser-sinc upsampler and downsampler (12 taps, replicate padding). The filters are checkpoint
buffers; they are also rebuilt here for fresh models. Key names follow ``bigvgan_generator.pt``
after ``remove_weight_norm()``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class BigVGANDims:
    num_mels: int = 100
    upsample_rates: tuple[int, ...] = (4, 4, 2, 2, 2, 2)
    upsample_kernel_sizes: tuple[int, ...] = (8, 8, 4, 4, 4, 4)
    upsample_initial_channel: int = 1536
    resblock: str = "1"  # "1": AMPBlock1 (two convs per dilation), "2": AMPBlock2
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    activation: str = "snakebeta"  # or "snake"
    snake_logscale: bool = True  # alpha/beta stored as logs
    use_tanh_at_final: bool = False  # False: clamp to [-1, 1]
    use_bias_at_final: bool = False  # conv_post bias
    sampling_rate: int = 24000

    @property
    def hop(self) -> int:
        return math.prod(self.upsample_rates)

    @staticmethod
    def from_config(h: dict) -> "BigVGANDims":
        """From the official ``config.json`` (training-only keys ignored)."""
        try:
            return BigVGANDims(
                num_mels=int(h["num_mels"]),
                upsample_rates=tuple(int(u) for u in h["upsample_rates"]),
                upsample_kernel_sizes=tuple(int(k) for k in h["upsample_kernel_sizes"]),
                upsample_initial_channel=int(h["upsample_initial_channel"]),
                resblock=str(h["resblock"]),
                resblock_kernel_sizes=tuple(int(k) for k in h["resblock_kernel_sizes"]),
                resblock_dilation_sizes=tuple(tuple(int(d) for d in ds) for ds in h["resblock_dilation_sizes"]),
                activation=str(h["activation"]),
                snake_logscale=bool(h.get("snake_logscale", False)),
                use_tanh_at_final=bool(h.get("use_tanh_at_final", True)),  # official defaults
                use_bias_at_final=bool(h.get("use_bias_at_final", True)),
                sampling_rate=int(h.get("sampling_rate", 24000)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"BigVGAN config is missing or has a bad value for {e}") from e


def kaiser_sinc_filter(cutoff: float, half_width: float, kernel_size: int) -> torch.Tensor:
    """(1, 1, K) Kaiser-windowed sinc low-pass normalised to unit sum (official ``kaiser_sinc_filter1d``)."""
    even = kernel_size % 2 == 0
    half = kernel_size // 2
    a = 2.285 * (half - 1) * math.pi * (4 * half_width) + 7.95
    if a > 50.0:
        beta = 0.1102 * (a - 8.7)
    elif a >= 21.0:
        beta = 0.5842 * (a - 21) ** 0.4 + 0.07886 * (a - 21.0)
    else:
        beta = 0.0
    window = torch.kaiser_window(kernel_size, beta=beta, periodic=False)
    time = torch.arange(-half, half) + 0.5 if even else torch.arange(kernel_size) - half
    filt = 2 * cutoff * window * torch.sinc(2 * cutoff * time)
    filt /= filt.sum()
    return filt.view(1, 1, kernel_size)


class Snake(nn.Module):
    """x + 1/a * sin^2(a x), per-channel a (log scale if ``logscale``)."""

    def __init__(self, channels: int, logscale: bool):
        super().__init__()
        self.logscale = logscale
        self.alpha = nn.Parameter(torch.zeros(channels) if logscale else torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, T)
        alpha = self.alpha[None, :, None]
        if self.logscale:
            alpha = torch.exp(alpha)
        return x + (1.0 / (alpha + 1e-9)) * torch.pow(torch.sin(x * alpha), 2)


class SnakeBeta(nn.Module):
    """x + 1/b * sin^2(a x), separate per-channel frequency a and magnitude b."""

    def __init__(self, channels: int, logscale: bool):
        super().__init__()
        self.logscale = logscale
        init = torch.zeros(channels) if logscale else torch.ones(channels)
        self.alpha = nn.Parameter(init.clone())
        self.beta = nn.Parameter(init.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, T)
        alpha = self.alpha[None, :, None]
        beta = self.beta[None, :, None]
        if self.logscale:
            alpha = torch.exp(alpha)
            beta = torch.exp(beta)
        return x + (1.0 / (beta + 1e-9)) * torch.pow(torch.sin(x * alpha), 2)


class UpSample1d(nn.Module):
    def __init__(self, ratio: int = 2, kernel_size: int = 12):
        super().__init__()
        self.ratio = ratio
        self.pad = kernel_size // ratio - 1
        self.pad_left = self.pad * ratio + (kernel_size - ratio) // 2
        self.pad_right = self.pad * ratio + (kernel_size - ratio + 1) // 2
        self.register_buffer("filter", kaiser_sinc_filter(0.5 / ratio, 0.6 / ratio, kernel_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, T) -> (B, C, ratio*T)
        c = x.shape[1]
        x = F.pad(x, (self.pad, self.pad), mode="replicate")
        x = self.ratio * F.conv_transpose1d(x, self.filter.expand(c, -1, -1), stride=self.ratio, groups=c)
        return x[..., self.pad_left : -self.pad_right]


class LowPassFilter1d(nn.Module):
    def __init__(self, cutoff: float, half_width: float, stride: int, kernel_size: int = 12):
        super().__init__()
        even = kernel_size % 2 == 0
        self.pad_left = kernel_size // 2 - int(even)
        self.pad_right = kernel_size // 2
        self.stride = stride
        self.register_buffer("filter", kaiser_sinc_filter(cutoff, half_width, kernel_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = x.shape[1]
        x = F.pad(x, (self.pad_left, self.pad_right), mode="replicate")
        return F.conv1d(x, self.filter.expand(c, -1, -1), stride=self.stride, groups=c)


class DownSample1d(nn.Module):
    def __init__(self, ratio: int = 2, kernel_size: int = 12):
        super().__init__()
        self.lowpass = LowPassFilter1d(0.5 / ratio, 0.6 / ratio, ratio, kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, ratio*T) -> (B, C, T)
        return self.lowpass(x)


class Activation1d(nn.Module):
    """Anti-aliased activation: upsample x2, act, downsample x2."""

    def __init__(self, act: nn.Module, ratio: int = 2, kernel_size: int = 12):
        super().__init__()
        self.act = act
        self.upsample = UpSample1d(ratio, kernel_size)
        self.downsample = DownSample1d(ratio, kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.downsample(self.act(self.upsample(x)))


def _activation(dims: BigVGANDims, channels: int) -> Activation1d:
    if dims.activation == "snakebeta":
        return Activation1d(SnakeBeta(channels, dims.snake_logscale))
    if dims.activation == "snake":
        return Activation1d(Snake(channels, dims.snake_logscale))
    raise ValueError(f"BigVGAN activation must be 'snake' or 'snakebeta', got {dims.activation!r}")


def _same_padding(kernel: int, dilation: int) -> int:
    return (kernel * dilation - dilation) // 2


class AMPBlock1(nn.Module):
    def __init__(self, dims: BigVGANDims, channels: int, kernel: int, dilations: tuple[int, ...]):
        super().__init__()
        self.convs1 = nn.ModuleList(
            [nn.Conv1d(channels, channels, kernel, 1, dilation=d, padding=_same_padding(kernel, d)) for d in dilations]
        )
        self.convs2 = nn.ModuleList(
            [nn.Conv1d(channels, channels, kernel, 1, dilation=1, padding=_same_padding(kernel, 1)) for _ in dilations]
        )
        self.activations = nn.ModuleList([_activation(dims, channels) for _ in range(2 * len(dilations))])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for c1, c2, a1, a2 in zip(self.convs1, self.convs2, self.activations[::2], self.activations[1::2]):
            x = c2(a2(c1(a1(x)))) + x
        return x


class AMPBlock2(nn.Module):
    def __init__(self, dims: BigVGANDims, channels: int, kernel: int, dilations: tuple[int, ...]):
        super().__init__()
        self.convs = nn.ModuleList(
            [nn.Conv1d(channels, channels, kernel, 1, dilation=d, padding=_same_padding(kernel, d)) for d in dilations]
        )
        self.activations = nn.ModuleList([_activation(dims, channels) for _ in dilations])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for c, a in zip(self.convs, self.activations):
            x = c(a(x)) + x
        return x


class BigVGAN(nn.Module):
    """log-mel (B, num_mels, T) -> waveform (B, 1, T * hop) in [-1, 1]."""

    def __init__(self, dims: BigVGANDims):
        super().__init__()
        if dims.resblock not in ("1", "2"):
            raise ValueError(f"BigVGAN resblock must be '1' or '2', got {dims.resblock!r}")
        if len(dims.upsample_rates) != len(dims.upsample_kernel_sizes):
            raise ValueError("BigVGAN upsample_rates and upsample_kernel_sizes differ in length")
        self.dims = dims
        c0 = dims.upsample_initial_channel
        self.conv_pre = nn.Conv1d(dims.num_mels, c0, 7, 1, padding=3)
        self.ups = nn.ModuleList(
            [
                nn.ModuleList([nn.ConvTranspose1d(c0 // 2**i, c0 // 2 ** (i + 1), k, u, padding=(k - u) // 2)])
                for i, (u, k) in enumerate(zip(dims.upsample_rates, dims.upsample_kernel_sizes))
            ]
        )
        block = AMPBlock1 if dims.resblock == "1" else AMPBlock2
        self.resblocks = nn.ModuleList()
        ch = c0
        for i in range(len(self.ups)):
            ch = c0 // 2 ** (i + 1)
            for k, d in zip(dims.resblock_kernel_sizes, dims.resblock_dilation_sizes):
                self.resblocks.append(block(dims, ch, k, tuple(d)))
        self.activation_post = _activation(dims, ch)
        self.conv_post = nn.Conv1d(ch, 1, 7, 1, padding=3, bias=dims.use_bias_at_final)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = self.conv_pre(mel)
        nk = len(self.dims.resblock_kernel_sizes)
        for i, up in enumerate(self.ups):
            x = up[0](x)  # no activation before the upsampler in BigVGAN-v2
            xs = self.resblocks[i * nk](x)
            for j in range(1, nk):
                xs = xs + self.resblocks[i * nk + j](x)
            x = xs / nk
        x = self.conv_post(self.activation_post(x))
        return torch.tanh(x) if self.dims.use_tanh_at_final else torch.clamp(x, min=-1.0, max=1.0)
