"""ERes2NetV2 speaker-verification network (official ``GPT_SoVITS/eres2net/ERes2NetV2.py``), as used by v2Pro /
v2ProPlus.

Only ``embed_frames`` (the official ``forward3``) runs at inference: fbank (B, frames, 80) ->
time-mean of the fused stage-3/4 feature map flattened over (channel, frequency) -> (B, 20480).
The pooling/``seg_1`` head exists only so the official checkpoint loads strictly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from engine.models.sovits_modules import sequence_mask


@dataclass(frozen=True)
class ERes2NetV2Dims:
    """Sizes of ERes2NetV2; the defaults are ``sv.py``'s ``ERes2NetV2(baseWidth=24, scale=4, expansion=4)``."""

    base_width: int = 24
    scale: int = 4
    expansion: int = 4
    m_channels: int = 64
    feat_dim: int = 80
    embedding_size: int = 192
    num_blocks: tuple[int, int, int, int] = (3, 4, 6, 3)

    @classmethod
    def from_state_dict(cls, sd: dict[str, torch.Tensor]) -> "ERes2NetV2Dims":
        """Sizes read from the tensors (official files give the defaults; shrunk test files their own)."""
        m = int(sd["conv1.weight"].shape[0])
        scale = len({k.split(".")[3] for k in sd if k.startswith("layer1.0.convs.")})
        expansion = int(sd["layer1.0.conv3.weight"].shape[0]) // m
        widths = [int(sd[f"layer{i}.0.convs.0.weight"].shape[0]) for i in range(1, 5)]
        base_width = next((bw for bw in range(1, 257)
                           if all(int(math.floor(m * 2**i * (bw / 64.0))) == w for i, w in enumerate(widths))), None)
        if base_width is None:
            raise ValueError(f"no baseWidth fits the block widths {widths}")
        blocks = tuple(len({k.split(".")[1] for k in sd if k.startswith(f"layer{i}.")}) for i in range(1, 5))
        seg_in, emb = int(sd["seg_1.weight"].shape[1]), int(sd["seg_1.weight"].shape[0])
        feat_dim = seg_in // (m * 8 * expansion * 2) * 8
        return cls(base_width, scale, expansion, m, feat_dim, emb, blocks)

    @property
    def embedding_dim(self) -> int:
        """Length of the ``embed_frames`` vector: 8*m*expansion channels x feat_dim/8 rows (20480)."""
        return self.m_channels * 8 * self.expansion * math.ceil(self.feat_dim / 8)


def _relu20(x: torch.Tensor) -> torch.Tensor:
    """The blocks' "ReLU" is a Hardtanh(0, 20) in the official code."""
    return F.hardtanh(x, 0.0, 20.0)


class AFF(nn.Module):
    """Attentional feature fusion of two equal-shape maps (keys ``local_att.{0,1,3,4}``)."""

    def __init__(self, channels: int, r: int = 4):
        super().__init__()
        inter = channels // r
        self.local_att = nn.Sequential(
            nn.Conv2d(channels * 2, inter, kernel_size=1),
            nn.BatchNorm2d(inter),
            nn.SiLU(),
            nn.Conv2d(inter, channels, kernel_size=1),
            nn.BatchNorm2d(channels),
        )

    def forward(self, x: torch.Tensor, ds_y: torch.Tensor) -> torch.Tensor:
        att = 1.0 + torch.tanh(self.local_att(torch.cat((x, ds_y), dim=1)))
        return torch.mul(x, att) + torch.mul(ds_y, 2.0 - att)


def _zero_past(x: torch.Tensor, frames: torch.Tensor | None) -> torch.Tensor:
    """(B, C, F, T) with every time step at or past ``frames[b]`` zeroed (None: unchanged)."""
    if frames is None:
        return x
    return x * sequence_mask(frames.to(x.device), x.shape[-1])[:, None, None, :].to(x.dtype)


class ERes2NetV2Block(nn.Module):
    """Res2Net-style bottleneck; with ``fuse`` the split branches are merged by AFF instead of a sum."""

    def __init__(self, in_planes: int, planes: int, stride: int, base_width: int, scale: int, expansion: int, fuse: bool):
        super().__init__()
        width = int(math.floor(planes * (base_width / 64.0)))
        self.width = width
        self.scale = scale
        self.conv1 = nn.Conv2d(in_planes, width * scale, kernel_size=1, stride=stride, bias=False)
        self.bn1 = nn.BatchNorm2d(width * scale)
        self.convs = nn.ModuleList(nn.Conv2d(width, width, kernel_size=3, padding=1, bias=False) for _ in range(scale))
        self.bns = nn.ModuleList(nn.BatchNorm2d(width) for _ in range(scale))
        if fuse:
            self.fuse_models = nn.ModuleList(AFF(width, r=4) for _ in range(scale - 1))
        self.fuse = fuse
        self.conv3 = nn.Conv2d(width * scale, planes * expansion, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * expansion)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != expansion * planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, expansion * planes, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(expansion * planes),
            )

    def forward(self, x: torch.Tensor, frames: torch.Tensor | None = None) -> torch.Tensor:
        """``frames`` (B,): each row's valid frames at this block's output (None: every frame is valid). The
        3x3 convolutions then see zeros past a row's end, as the row alone would (padding); frames past it are
        garbage."""
        out = _relu20(self.bn1(self.conv1(x)))
        spx = torch.split(out, self.width, 1)
        outs = []
        sp = spx[0]
        for i in range(self.scale):
            if i > 0:
                sp = self.fuse_models[i - 1](sp, spx[i]) if self.fuse else sp + spx[i]
            sp = _relu20(self.bns[i](self.convs[i](_zero_past(sp, frames))))
            outs.append(sp)
        out = self.bn3(self.conv3(torch.cat(outs, 1)))
        return _relu20(out + self.shortcut(x))


class ERes2NetV2(nn.Module):
    """Speaker embedding network: Kaldi fbank (B, frames, 80) -> (B, 20480) via :meth:`embed_frames`."""

    def __init__(self, dims: ERes2NetV2Dims = ERes2NetV2Dims()):
        super().__init__()
        self.dims = dims
        m, e = dims.m_channels, dims.expansion
        self._in_planes = m
        self.conv1 = nn.Conv2d(1, m, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(m)
        self.layer1 = self._make_layer(m, dims.num_blocks[0], 1, fuse=False)
        self.layer2 = self._make_layer(m * 2, dims.num_blocks[1], 2, fuse=False)
        self.layer3 = self._make_layer(m * 4, dims.num_blocks[2], 2, fuse=True)
        self.layer4 = self._make_layer(m * 8, dims.num_blocks[3], 2, fuse=True)
        self.layer3_ds = nn.Conv2d(m * 4 * e, m * 8 * e, kernel_size=3, padding=1, stride=2, bias=False)
        self.fuse34 = AFF(m * 8 * e, r=4)
        stats_dim = int(dims.feat_dim / 8) * m * 8
        self.seg_1 = nn.Linear(stats_dim * e * 2, dims.embedding_size)  # unused head (TSTP pooling)

    def _make_layer(self, planes: int, n: int, stride: int, fuse: bool) -> nn.Sequential:
        d = self.dims
        blocks = []
        for s in [stride] + [1] * (n - 1):
            blocks.append(ERes2NetV2Block(self._in_planes, planes, s, d.base_width, d.scale, d.expansion, fuse))
            self._in_planes = planes * d.expansion
        return nn.Sequential(*blocks)

    def embed_frames(self, feats: torch.Tensor, frames: torch.Tensor | None = None) -> torch.Tensor:
        """(B, frames, feat_dim) -> (B, C*F') time-averaged fused features (the official ``forward3``).

        ``frames`` (B,): the valid frames of each row of a right-padded batch (None: all). Every 3x3
        convolution then sees zeros past a row's end and the time average covers the row's own frames, so
        each row gets its embedding alone, up to rounding."""
        x = _zero_past(feats.permute(0, 2, 1).unsqueeze(1), frames)  # (B, 1, feat_dim, frames)
        out = F.relu(self.bn1(self.conv1(x)))
        n = frames
        for layer in (self.layer1, self.layer2, self.layer3):
            out, n = self._masked_layer(layer, out, n)
        out3 = out
        out4, n4 = self._masked_layer(self.layer4, out3, n)
        fused = self.fuse34(out4, self.layer3_ds(_zero_past(out3, n)))  # (B, 8*m*e, feat_dim/8, frames/8)
        flat = fused.flatten(start_dim=1, end_dim=2)
        if n4 is None:
            return flat.mean(-1)
        return _zero_past(flat.unsqueeze(2), n4).squeeze(2).sum(-1) / n4.to(flat.device, flat.dtype)[:, None]

    @staticmethod
    def _masked_layer(layer: nn.Sequential, x: torch.Tensor, frames: torch.Tensor | None,
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A stage of blocks, each told its rows' valid frames (a stride-2 block halves them, rounding up)."""
        for block in layer:
            stride = block.conv1.stride[1]
            if frames is not None and stride != 1:
                frames = (frames + stride - 1) // stride
            x = block(x, frames)
        return x, frames
