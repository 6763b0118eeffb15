"""HiFi-GAN v1 style generator (official ``GPT_SoVITS/module/models.py``, ``Generator``): latent frames -> waveform.

The same class is the SoVITS v1/v2/v2Pro* decoder (``dec``, conditioned on the style vector,
``is_bias=False``) and the v4 vocoder (mel in, ``gin_channels=0``, ``is_bias=True``). Convs hold
plain weights: the SoVITS files store the weight-normed ones as weight_g/weight_v, which
``engine.models.sovits_modules.fold_weight_norm`` folds at load time (they are marked here); the v4
vocoder file already holds plain weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from engine.models.leaky_mask import leaky_masked
from engine.models.sovits_modules import mark_weight_norm

LRELU_SLOPE = 0.1  # inside resblocks and before each upsampler; conv_post gets F.leaky_relu's 0.01


def _same_padding(kernel_size: int, dilation: int = 1) -> int:
    return (kernel_size * dilation - dilation) // 2


class ResBlock1(nn.Module):
    """Three (dilated conv, conv) residual pairs with LeakyReLU(0.1) before each conv."""

    def __init__(self, channels: int, kernel_size: int = 3, dilation: Sequence[int] = (1, 3, 5)):
        super().__init__()
        self.convs1 = nn.ModuleList(
            mark_weight_norm(nn.Conv1d(channels, channels, kernel_size, 1, dilation=d,
                                       padding=_same_padding(kernel_size, d)))
            for d in dilation
        )
        self.convs2 = nn.ModuleList(
            mark_weight_norm(nn.Conv1d(channels, channels, kernel_size, 1, dilation=1,
                                       padding=_same_padding(kernel_size, 1)))
            for _ in dilation
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``mask`` (B, 1, T): zero every conv's input past each row's length, so a right-padded row gives
        the numbers of the row alone (whose convs see zeros there); positions past the length are garbage."""
        for c1, c2 in zip(self.convs1, self.convs2):
            xt = c1(leaky_masked(x, LRELU_SLOPE, mask))
            xt = c2(leaky_masked(xt, LRELU_SLOPE, mask))
            x = xt + x
        return x


def _masked(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return x if mask is None else x * mask


class Generator(nn.Module):
    """HiFi-GAN generator: ``(B, initial_channel, T)`` (+ ``g`` (B, gin, 1)) -> ``(B, 1, T * prod(upsample_rates))``."""

    def __init__(
        self,
        initial_channel: int,
        resblock_kernel_sizes: Sequence[int],
        resblock_dilation_sizes: Sequence[Sequence[int]],
        upsample_rates: Sequence[int],
        upsample_initial_channel: int,
        upsample_kernel_sizes: Sequence[int],
        gin_channels: int = 0,
        is_bias: bool = False,
    ):
        super().__init__()
        if len(upsample_rates) != len(upsample_kernel_sizes):
            raise ValueError("upsample_rates and upsample_kernel_sizes differ in length")
        self.num_kernels = len(resblock_kernel_sizes)
        self.num_upsamples = len(upsample_rates)
        self.conv_pre = nn.Conv1d(initial_channel, upsample_initial_channel, 7, 1, padding=3)
        self.ups = nn.ModuleList()
        for i, (u, k) in enumerate(zip(upsample_rates, upsample_kernel_sizes)):
            c_in, c_out = upsample_initial_channel // (2**i), upsample_initial_channel // (2 ** (i + 1))
            self.ups.append(mark_weight_norm(nn.ConvTranspose1d(c_in, c_out, k, u, padding=(k - u) // 2)))
        self.resblocks = nn.ModuleList()
        ch = upsample_initial_channel
        for i in range(self.num_upsamples):
            ch = upsample_initial_channel // (2 ** (i + 1))
            for k, d in zip(resblock_kernel_sizes, resblock_dilation_sizes):
                self.resblocks.append(ResBlock1(ch, k, d))
        self.conv_post = nn.Conv1d(ch, 1, 7, 1, padding=3, bias=is_bias)
        if gin_channels:
            self.cond = nn.Conv1d(gin_channels, upsample_initial_channel, 1)

    def forward(self, x: torch.Tensor, g: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                ) -> torch.Tensor:
        """``mask`` (B, 1, T) of a right-padded batch: each row's first ``T_row * prod(upsample_rates)`` samples
        are what the row alone gives (up to rounding: every conv input is zeroed past the row's length, as a
        conv's own zero padding does for the row alone); later samples are garbage. None: the official
        forward, unchanged."""
        x = self.conv_pre(_masked(x, mask))
        if g is not None:
            x = x + self.cond(g)
        for i in range(self.num_upsamples):
            x = self.ups[i](leaky_masked(x, LRELU_SLOPE, mask))
            if mask is not None:  # a transposed conv of stride u with padding (k - u) / 2: frame t -> [u t, u t + u)
                mask = mask.repeat_interleave(self.ups[i].stride[0], dim=2)
            xs = None
            for j in range(self.num_kernels):
                r = self.resblocks[i * self.num_kernels + j](x, mask)
                xs = r if xs is None else xs + r
            x = xs / self.num_kernels
        x = self.conv_post(leaky_masked(x, 0.01, mask))  # F.leaky_relu's default slope here (official)
        return torch.tanh(x)
