"""Channels-last (NWC) 1-D convolutions: the same numbers as ``nn.Conv1d`` / ``nn.ConvTranspose1d``, with the
activations kept time-major in memory.

Why: cuDNN's fp16/bf16 tensor-core convolutions work on channels-last data. Given the usual (B, C, T) layout,
each convolution of the HiFi-GAN decoder is wrapped in two layout transposes (15% of the acoustic stage's
kernel time on an H100). Run as the 2-D convolution of a (B, C, 1, T) channels-last view, a convolution takes
and gives NWC memory, the element-wise work between convolutions keeps that layout, and no transposes remain.
On an H100 (benchmarks/acoustic_levers.py, docs/benchmarks.md) this alone made the voicing of 64 streamed
chunks 13-15% faster, and under ``torch.compile`` 2.1x (the fused element-wise kernels read NWC too).

:func:`nwc_convolutions` converts a module's convolutions in place: their class changes (their parameters,
``state_dict`` and ``forward`` signature do not), and each holds its weight as a 4-D channels-last copy, made
from the weight it has then (convert after the module is on its device and in its dtype). Tensors they return
are (B, C, T) views of NWC memory (not ``is_contiguous()``); code that needs contiguous input must say so.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def _nwc_weight(weight: torch.Tensor) -> torch.Tensor:
    return weight.detach().unsqueeze(2).contiguous(memory_format=torch.channels_last)


def _as_nwc_2d(x: torch.Tensor) -> torch.Tensor:
    """(B, C, T) -> (B, C, 1, T) channels-last: a view when ``x`` already holds NWC memory, else one copy."""
    return x.unsqueeze(2).contiguous(memory_format=torch.channels_last)


class NWCConv1d(nn.Conv1d):
    """An ``nn.Conv1d`` (zero padding) computed as a channels-last 2-D convolution (made by :func:`nwc_convolutions`)."""

    nwc_weight: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.conv2d(_as_nwc_2d(x), self.nwc_weight, self.bias, (1, self.stride[0]), (0, self.padding[0]),
                       (1, self.dilation[0]), self.groups)
        return out.squeeze(2)


class NWCConvTranspose1d(nn.ConvTranspose1d):
    """An ``nn.ConvTranspose1d`` (zero padding, no ``output_size``) computed as a channels-last 2-D transposed
    convolution (made by :func:`nwc_convolutions`)."""

    nwc_weight: torch.Tensor

    def forward(self, x: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        if output_size is not None:
            raise ValueError("NWCConvTranspose1d takes no output_size")
        out = F.conv_transpose2d(_as_nwc_2d(x), self.nwc_weight, self.bias, (1, self.stride[0]),
                                 (0, self.padding[0]), (0, self.output_padding[0]), self.groups,
                                 (1, self.dilation[0]))
        return out.squeeze(2)


_NWC = {nn.Conv1d: NWCConv1d, nn.ConvTranspose1d: NWCConvTranspose1d}


def nwc_convolutions(*modules: nn.Module) -> int:
    """Make every plain ``nn.Conv1d`` / ``nn.ConvTranspose1d`` (zero padding) inside ``modules`` channels-last,
    in place (see the module docstring); returns how many were converted (already converted ones are skipped,
    so a second call converts none)."""
    done = 0
    for module in modules:
        for m in module.modules():
            nwc = _NWC.get(type(m))
            if nwc is None or m.padding_mode != "zeros":
                continue
            m.__class__ = nwc
            m.register_buffer("nwc_weight", _nwc_weight(m.weight), persistent=False)
            done += 1
    return done
