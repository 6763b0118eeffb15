"""The DiT velocity estimator of the v3/v4 CFM (official ``GPT_SoVITS/f5_tts/model/backbones/dit.py``, ``DiT``).

Module and parameter names follow the official state dict (``cfm.estimator.*``), so a
checkpoint loads without renaming. Shapes: B batch, T frames, C channels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

TEXT_POSITIONS = 4096  # precomputed sinusoid positions of the condition embedding (official constant)


@dataclass(frozen=True)
class DiTDims:
    dim: int = 1024  # transformer width
    depth: int = 22  # number of DiT blocks
    heads: int = 16
    dim_head: int = 64  # also the rotary width: RoPE covers the first dim_head channels of q and k
    ff_mult: int = 2
    mel_dim: int = 100
    text_dim: int = 512  # width of the SoVITS features that condition the DiT
    conv_layers: int = 4  # ConvNeXtV2 blocks of the condition embedding
    conv_mult: int = 2
    freq_embed_dim: int = 256  # sinusoid width of the time embeddings
    rope_interleaved: bool = True  # x-transformers >= 2024-05 pairs channels (0,1),(2,3)...; False = half split

    @property
    def inner_dim(self) -> int:
        return self.heads * self.dim_head


def sinusoid_embedding(t: torch.Tensor, dim: int, scale: float = 1000.0) -> torch.Tensor:
    """(B,) -> (B, dim): [sin, cos] of scale*t at geometric frequencies (official SinusPositionEmbedding)."""
    half = dim // 2
    step = math.log(10000) / (half - 1)
    freqs = torch.exp(torch.arange(half, device=t.device).float() * -step)
    arg = scale * t.unsqueeze(1) * freqs.unsqueeze(0)
    return torch.cat((arg.sin(), arg.cos()), dim=-1)


def text_position_table(dim: int, end: int = TEXT_POSITIONS, theta: float = 10000.0) -> torch.Tensor:
    """(end, dim): [cos(p*w_j) ++ sin(p*w_j)], w_j = theta^(-2j/dim), the condition's absolute positions."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    t = torch.arange(end, device=freqs.device)
    angles = torch.outer(t, freqs).float()
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


class TimestepEmbedding(nn.Module):
    def __init__(self, dim: int, freq_embed_dim: int = 256):
        super().__init__()
        self.freq_embed_dim = freq_embed_dim
        self.time_mlp = nn.Sequential(nn.Linear(freq_embed_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: torch.Tensor) -> torch.Tensor:  # (B,) -> (B, dim)
        hidden = sinusoid_embedding(t, self.freq_embed_dim).to(t.dtype)
        return self.time_mlp(hidden)


class GRN(nn.Module):
    """Global response normalisation; the norm runs over the TIME axis, so it sees the whole chunk."""

    def __init__(self, dim: int):
        super().__init__()
        self.gamma = nn.Parameter(torch.zeros(1, 1, dim))
        self.beta = nn.Parameter(torch.zeros(1, 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C)
        gx = torch.norm(x, p=2, dim=1, keepdim=True)  # (B, 1, C)
        nx = gx / (gx.mean(dim=-1, keepdim=True) + 1e-6)
        return self.gamma * (x * nx) + self.beta + x


class ConvNeXtV2Block(nn.Module):
    def __init__(self, dim: int, intermediate_dim: int):
        super().__init__()
        self.dwconv = nn.Conv1d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, intermediate_dim)
        self.act = nn.GELU()
        self.grn = GRN(intermediate_dim)
        self.pwconv2 = nn.Linear(intermediate_dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C)
        h = self.dwconv(x.transpose(1, 2)).transpose(1, 2)
        h = self.pwconv2(self.grn(self.act(self.pwconv1(self.norm(h)))))
        return x + h


class TextEmbedding(nn.Module):
    """Condition features + absolute sinusoid positions, then ConvNeXtV2 blocks."""

    def __init__(self, text_dim: int, conv_layers: int, conv_mult: int):
        super().__init__()
        self.text_blocks = nn.Sequential(*[ConvNeXtV2Block(text_dim, text_dim * conv_mult) for _ in range(conv_layers)])
        self.register_buffer("freqs_cis", text_position_table(text_dim), persistent=False)

    def forward(self, text: torch.Tensor) -> torch.Tensor:  # (B, T, text_dim)
        if len(self.text_blocks) == 0:
            return text
        n = text.shape[1]
        pos = torch.arange(n, device=text.device).clamp(max=TEXT_POSITIONS - 1)
        text = text + self.freqs_cis[pos].to(text.dtype)  # (T, C) broadcast over B
        return self.text_blocks(text)


class ConvPositionEmbedding(nn.Module):
    def __init__(self, dim: int, kernel_size: int = 31, groups: int = 16):
        super().__init__()
        self.conv1d = nn.Sequential(
            nn.Conv1d(dim, dim, kernel_size, groups=groups, padding=kernel_size // 2),
            nn.Mish(),
            nn.Conv1d(dim, dim, kernel_size, groups=groups, padding=kernel_size // 2),
            nn.Mish(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C)
        return self.conv1d(x.transpose(1, 2)).transpose(1, 2)


class InputEmbedding(nn.Module):
    def __init__(self, mel_dim: int, text_dim: int, out_dim: int):
        super().__init__()
        self.proj = nn.Linear(mel_dim * 2 + text_dim, out_dim)
        self.conv_pos_embed = ConvPositionEmbedding(out_dim)

    def forward(self, x: torch.Tensor, cond: torch.Tensor, text_embed: torch.Tensor) -> torch.Tensor:
        x = self.proj(torch.cat((x, cond, text_embed), dim=-1))  # (B, T, dim)
        return self.conv_pos_embed(x) + x


class RotaryEmbedding(nn.Module):
    """Rotary angles; ``inv_freq`` is a checkpoint buffer (stored in float16 by the official save)."""

    def __init__(self, dim_head: int, base: float = 10000.0, interleaved: bool = True):
        super().__init__()
        self.interleaved = interleaved
        self.register_buffer("inv_freq", 1.0 / (base ** (torch.arange(0, dim_head, 2).float() / dim_head)))

    def forward(self, n: int) -> torch.Tensor:  # -> (1, T, dim_head) angles
        t = torch.arange(n, device=self.inv_freq.device).type_as(self.inv_freq)
        angles = t[:, None] * self.inv_freq[None, :]  # (T, dim_head/2)
        if self.interleaved:
            angles = torch.stack((angles, angles), dim=-1).flatten(-2)  # θ0,θ0,θ1,θ1,...
        else:
            angles = torch.cat((angles, angles), dim=-1)  # θ0..θn,θ0..θn
        return angles[None]


def apply_rotary(x: torch.Tensor, angles: torch.Tensor, interleaved: bool = True) -> torch.Tensor:
    """Rotate the first ``angles.shape[-1]`` channels of x (B, T, C); the rest pass through."""
    rot = angles.shape[-1]
    xr, xp = x[..., :rot], x[..., rot:]
    if interleaved:
        pairs = xr.unflatten(-1, (-1, 2))  # (..., rot/2, 2)
        turned = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    else:
        a, b = xr.chunk(2, dim=-1)
        turned = torch.cat((-b, a), dim=-1)
    xr = xr * angles.cos() + turned * angles.sin()
    return torch.cat((xr, xp), dim=-1).type(x.dtype)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int):
        super().__init__()
        self.heads = heads
        inner = heads * dim_head
        self.to_q = nn.Linear(dim, inner)
        self.to_k = nn.Linear(dim, inner)
        self.to_v = nn.Linear(dim, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim)])  # index 0 as in the official key "to_out.0"

    def forward(self, x: torch.Tensor, mask: torch.Tensor, angles: torch.Tensor, interleaved: bool) -> torch.Tensor:
        b, n, _ = x.shape
        # RoPE acts on the full-width q/k BEFORE the head split: only head 0 gets positions (official quirk).
        q = apply_rotary(self.to_q(x), angles, interleaved)
        k = apply_rotary(self.to_k(x), angles, interleaved)
        v = self.to_v(x)
        q, k, v = (z.view(b, n, self.heads, -1).transpose(1, 2) for z in (q, k, v))  # (B, H, T, Dh)
        attn_mask = mask[:, None, None, :].expand(b, self.heads, n, n)  # keys that exist
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=0.0, is_causal=False)
        out = out.transpose(1, 2).reshape(b, n, -1).to(q.dtype)  # (B, T, inner)
        out = self.to_out[0](out)
        return out.masked_fill(~mask[..., None], 0.0)


class AdaLayerNormZero(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.silu = nn.SiLU()
        self.linear = nn.Linear(dim, dim * 6)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)

    def forward(self, x: torch.Tensor, emb: torch.Tensor):
        emb = self.linear(self.silu(emb))
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = torch.chunk(emb, 6, dim=1)
        x = self.norm(x) * (1 + scale_msa[:, None]) + shift_msa[:, None]
        return x, gate_msa, shift_mlp, scale_mlp, gate_mlp


class AdaLayerNormZeroFinal(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.silu = nn.SiLU()
        self.linear = nn.Linear(dim, dim * 2)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        emb = self.linear(self.silu(emb))
        scale, shift = torch.chunk(emb, 2, dim=1)  # scale FIRST here, unlike the blocks
        return self.norm(x) * (1 + scale)[:, None, :] + shift[:, None, :]


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int):
        super().__init__()
        inner = int(dim * mult)
        # indices as in the official keys ff.ff.0.0 / ff.ff.2 (index 1 was a dropout)
        self.ff = nn.Sequential(
            nn.Sequential(nn.Linear(dim, inner), nn.GELU(approximate="tanh")), nn.Identity(), nn.Linear(inner, dim)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ff(x)


class DiTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int, ff_mult: int):
        super().__init__()
        self.attn_norm = AdaLayerNormZero(dim)
        self.attn = Attention(dim, heads, dim_head)
        self.ff_norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.ff = FeedForward(dim, ff_mult)

    def forward(self, x, t, mask, angles, interleaved: bool):
        norm, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.attn_norm(x, t)
        x = x + gate_msa.unsqueeze(1) * self.attn(norm, mask, angles, interleaved)
        norm = self.ff_norm(x) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
        return x + gate_mlp.unsqueeze(1) * self.ff(norm)


@dataclass(frozen=True)
class DiTCondition:
    """What the sampler computes once per call and reuses at every step (official conditioner cache)."""

    text_embed: torch.Tensor  # (B, T, text_dim)
    dt_embed: torch.Tensor  # (B, dim)


class DiT(nn.Module):
    """Velocity field v(x_t, t | prompt mel, SoVITS features, step size)."""

    def __init__(self, dims: DiTDims):
        super().__init__()
        self.dims = dims
        self.time_embed = TimestepEmbedding(dims.dim, dims.freq_embed_dim)
        self.d_embed = TimestepEmbedding(dims.dim, dims.freq_embed_dim)
        self.text_embed = TextEmbedding(dims.text_dim, dims.conv_layers, dims.conv_mult)
        self.input_embed = InputEmbedding(dims.mel_dim, dims.text_dim, dims.dim)
        self.rotary_embed = RotaryEmbedding(dims.dim_head, interleaved=dims.rope_interleaved)
        self.transformer_blocks = nn.ModuleList(
            [DiTBlock(dims.dim, dims.heads, dims.dim_head, dims.ff_mult) for _ in range(dims.depth)]
        )
        self.norm_out = AdaLayerNormZeroFinal(dims.dim)
        self.proj_out = nn.Linear(dims.dim, dims.mel_dim)

    def condition(self, text: torch.Tensor, dt: torch.Tensor) -> DiTCondition:
        """text (B, text_dim, T) SoVITS features, dt (B,) step size -> the cached conditioning."""
        return DiTCondition(self.text_embed(text.transpose(1, 2)), self.d_embed(dt))

    def forward(
        self,
        x: torch.Tensor,  # (B, mel, T) current sample
        cond: torch.Tensor,  # (B, mel, T) prompt mel, zero after the prompt
        t: torch.Tensor,  # (B,) flow time
        condition: DiTCondition,
        lengths: torch.Tensor | None = None,  # (B,) valid frames; None = all
    ) -> torch.Tensor:  # -> (B, mel, T) velocity
        x, cond = x.transpose(1, 2), cond.transpose(1, 2)  # (B, T, mel)
        b, n = x.shape[0], x.shape[1]
        if lengths is None:
            mask = torch.ones(b, n, dtype=torch.bool, device=x.device)
        else:
            mask = torch.arange(n, device=x.device)[None, :] < lengths.to(x.device)[:, None]
        temb = self.time_embed(t) + condition.dt_embed  # (B, dim)
        h = self.input_embed(x, cond, condition.text_embed)  # (B, T, dim)
        angles = self.rotary_embed(n)
        for block in self.transformer_blocks:
            h = block(h, temb, mask, angles, self.dims.rope_interleaved)
        h = self.norm_out(h, temb)
        return self.proj_out(h).transpose(1, 2)


def dit_dims_from_state_dict(sd: dict[str, torch.Tensor], prefix: str = "cfm.estimator.") -> DiTDims:
    """Every DiT dimension from the weights; heads = q width / rotary width (dim_head)."""

    def shape(key: str) -> tuple[int, ...]:
        return tuple(sd[prefix + key].shape)

    def count(stem: str) -> int:
        return len(_prefixes(sd, prefix + stem))

    dim = shape("time_embed.time_mlp.2.weight")[0]
    dim_head = 2 * shape("rotary_embed.inv_freq")[0]
    inner = shape("transformer_blocks.0.attn.to_q.weight")[0]
    mel_dim = shape("proj_out.weight")[0]
    in_width = shape("input_embed.proj.weight")[1]
    text_dim = in_width - 2 * mel_dim
    conv_layers = count("text_embed.text_blocks")
    conv_mult = shape("text_embed.text_blocks.0.pwconv1.weight")[0] // text_dim if conv_layers else 2
    return DiTDims(
        dim=dim,
        depth=count("transformer_blocks"),
        heads=inner // dim_head,
        dim_head=dim_head,
        ff_mult=shape("transformer_blocks.0.ff.ff.0.0.weight")[0] // dim,
        mel_dim=mel_dim,
        text_dim=text_dim,
        conv_layers=conv_layers,
        conv_mult=conv_mult,
        freq_embed_dim=shape("time_embed.time_mlp.0.weight")[1],
    )


def _prefixes(sd: dict, stem: str) -> set[str]:
    """The distinct ``<stem>.<i>.`` prefixes present in sd."""
    out = set()
    for k in sd:
        if k.startswith(stem + "."):
            idx = k[len(stem) + 1 :].split(".", 1)[0]
            out.add(f"{stem}.{idx}.")
    return out
