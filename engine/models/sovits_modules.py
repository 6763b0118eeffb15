"""Building blocks of the SoVITS acoustic models (official ``GPT_SoVITS/module/``: ``attentions.py``,
``modules.py``, ``mrte_model.py``, ``models.py``), shared by v1/v2/v2Pro* and v3/v4.

Every class takes its sizes as arguments and holds no version logic; parameter names follow the
official state-dict keys so checkpoints load unchanged.

Weight norm: the official code wraps some convs in ``torch.nn.utils.weight_norm`` and stores them as
``<name>.weight_g`` / ``<name>.weight_v``. Our modules hold plain convs; :func:`fold_weight_norm`
turns each stored (g, v) pair into the effective ``weight`` once, at load time, with the same float32
formula the official forward evaluates on every call (so the result is bit-identical). Convs the
official code weight-norms are marked with :func:`mark_weight_norm`, which lets
:func:`unfold_weight_norm` write files in the official layout.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn
from torch.nn import functional as F

_WN_MARK = "_official_weight_norm"


# --------------------------------------------------------------------------------------------
# weight norm: one helper for the whole package


def mark_weight_norm(module: nn.Module) -> nn.Module:
    """Mark a conv whose official counterpart is weight-normed (stored as weight_g/weight_v)."""
    setattr(module, _WN_MARK, True)
    return module


def weight_norm_prefixes(model: nn.Module) -> list[str]:
    """State-dict prefixes (``"dec.ups.0"``) of every marked conv in ``model``."""
    return [name for name, m in model.named_modules() if getattr(m, _WN_MARK, False)]


def fold_weight_norm(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Replace every ``X.weight_g``/``X.weight_v`` pair by ``X.weight = g * v / ||v||``.

    The norm is over all axes but 0 (``weight_norm(dim=0)``); computed in float32 as the official
    float32 model does after loading its fp16 file. Other entries pass through unchanged.
    """
    out: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        if key.endswith(".weight_g"):
            base = key[: -len(".weight_g")]
            v = state_dict.get(base + ".weight_v")
            if v is None:
                out[key] = value
                continue
            out[base + ".weight"] = torch._weight_norm(v.float(), value.float(), 0)
        elif key.endswith(".weight_v") and key[: -len(".weight_v")] + ".weight_g" in state_dict:
            continue
        else:
            out[key] = value
    return out


def unfold_weight_norm(state_dict: Mapping[str, torch.Tensor], prefixes: list[str]) -> dict[str, torch.Tensor]:
    """Inverse of :func:`fold_weight_norm` for the given prefixes: ``weight`` -> (weight_g, weight_v).

    Keys come out in the official order (``bias, weight_g, weight_v``), with ``g = ||w||`` and ``v = w``.
    """
    wanted = set(prefixes)
    out: dict[str, torch.Tensor] = {}
    pending: dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        base, _, leaf = key.rpartition(".")
        if base in wanted and leaf == "weight":
            pending[base] = value
            if base + ".bias" not in state_dict:
                out.update(_gv(base, value))
                pending.pop(base)
            continue
        out[key] = value
        if base in pending and leaf == "bias":
            out.update(_gv(base, pending.pop(base)))
    return out


def _gv(base: str, w: torch.Tensor) -> dict[str, torch.Tensor]:
    dims = tuple(range(1, w.dim()))
    g = torch.linalg.vector_norm(w.float(), dim=dims, keepdim=True).to(w.dtype)
    return {base + ".weight_g": g, base + ".weight_v": w}


# --------------------------------------------------------------------------------------------
# masks and small layers


def sequence_mask(lengths: torch.Tensor, max_length: int) -> torch.Tensor:
    """(B,) lengths -> (B, max_length) bool, True on valid steps."""
    steps = torch.arange(max_length, dtype=lengths.dtype, device=lengths.device)
    return steps.unsqueeze(0) < lengths.unsqueeze(1)


class ChannelLayerNorm(nn.Module):
    """LayerNorm over the channel axis of a (B, C, T) tensor; parameters ``gamma``/``beta``."""

    def __init__(self, channels: int, eps: float = 1e-5):
        super().__init__()
        self.channels = channels
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.transpose(1, -1)  # (B, T, C)
        x = F.layer_norm(x, (self.channels,), self.gamma, self.beta, self.eps)
        return x.transpose(1, -1)


# --------------------------------------------------------------------------------------------
# VITS attention encoder (official module/attentions.py: Encoder, MultiHeadAttention, FFN)


class RelativeMultiHeadAttention(nn.Module):
    """VITS multi-head attention with 1x1 conv projections and optional windowed relative positions.

    ``window_size`` set: self-attention with shared relative key/value embeddings (distances
    -w..w); None: plain (cross-)attention, as in MRTE.
    """

    def __init__(self, channels: int, out_channels: int, n_heads: int, window_size: int | None = None):
        super().__init__()
        if channels % n_heads:
            raise ValueError(f"channels {channels} not divisible by n_heads {n_heads}")
        self.n_heads = n_heads
        self.k_channels = channels // n_heads
        self.window_size = window_size
        self.conv_q = nn.Conv1d(channels, channels, 1)
        self.conv_k = nn.Conv1d(channels, channels, 1)
        self.conv_v = nn.Conv1d(channels, channels, 1)
        self.conv_o = nn.Conv1d(channels, out_channels, 1)
        if window_size is not None:
            n_rel = 2 * window_size + 1
            self.emb_rel_k = nn.Parameter(torch.randn(1, n_rel, self.k_channels) * self.k_channels**-0.5)
            self.emb_rel_v = nn.Parameter(torch.randn(1, n_rel, self.k_channels) * self.k_channels**-0.5)

    def forward(self, x: torch.Tensor, c: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v = self.conv_q(x), self.conv_k(c), self.conv_v(c)
        return self.conv_o(self._attention(q, k, v, attn_mask))

    def _attention(self, query, key, value, mask):
        b, d, t_s = key.shape
        t_t = query.size(2)
        # (B, C, T) -> (B, heads, T, k_channels)
        query = query.view(b, self.n_heads, self.k_channels, t_t).transpose(2, 3)
        key = key.view(b, self.n_heads, self.k_channels, t_s).transpose(2, 3)
        value = value.view(b, self.n_heads, self.k_channels, t_s).transpose(2, 3)

        scaled_q = query / math.sqrt(self.k_channels)
        scores = torch.matmul(scaled_q, key.transpose(-2, -1))  # (B, h, t_t, t_s)
        if self.window_size is not None:
            rel_k = self._relative_embeddings(self.emb_rel_k, t_s)  # (1, 2t-1, kc)
            rel_logits = torch.matmul(scaled_q, rel_k.unsqueeze(0).transpose(-2, -1))  # (B, h, t, 2t-1)
            scores = scores + _relative_to_absolute(rel_logits)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e4)
        p_attn = F.softmax(scores, dim=-1)
        output = torch.matmul(p_attn, value)  # (B, h, t_t, kc)
        if self.window_size is not None:
            rel_weights = _absolute_to_relative(p_attn)  # (B, h, t, 2t-1)
            rel_v = self._relative_embeddings(self.emb_rel_v, t_s)
            output = output + torch.matmul(rel_weights, rel_v.unsqueeze(0))
        return output.transpose(2, 3).contiguous().view(b, d, t_t)

    def _relative_embeddings(self, emb: torch.Tensor, length: int) -> torch.Tensor:
        """The (1, 2*length-1, kc) slice of the embeddings for distances -(length-1)..length-1."""
        w = self.window_size
        pad = max(length - (w + 1), 0)
        start = max((w + 1) - length, 0)
        if pad > 0:
            emb = F.pad(emb, (0, 0, pad, pad))
        return emb[:, start : start + 2 * length - 1]


def _relative_to_absolute(x: torch.Tensor) -> torch.Tensor:
    """(B, h, l, 2l-1) logits indexed by relative distance -> (B, h, l, l) by absolute key position."""
    b, h, length, _ = x.shape
    x = F.pad(x, (0, 1))  # (B, h, l, 2l)
    x_flat = F.pad(x.view(b, h, length * 2 * length), (0, length - 1))
    return x_flat.view(b, h, length + 1, 2 * length - 1)[:, :, :length, length - 1 :]


def _absolute_to_relative(x: torch.Tensor) -> torch.Tensor:
    """(B, h, l, l) weights by absolute key position -> (B, h, l, 2l-1) by relative distance."""
    b, h, length, _ = x.shape
    x = F.pad(x, (0, length - 1))  # (B, h, l, 2l-1)
    x_flat = F.pad(x.view(b, h, length**2 + length * (length - 1)), (length, 0))
    return x_flat.view(b, h, length, 2 * length)[:, :, :, 1:]


class ConvFFN(nn.Module):
    """Position-wise FFN of two "same"-padded convs with ReLU, masked before each conv."""

    def __init__(self, in_channels: int, out_channels: int, filter_channels: int, kernel_size: int):
        super().__init__()
        self.kernel_size = kernel_size
        self.conv_1 = nn.Conv1d(in_channels, filter_channels, kernel_size)
        self.conv_2 = nn.Conv1d(filter_channels, out_channels, kernel_size)

    def _pad(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel_size == 1:
            return x
        return F.pad(x, ((self.kernel_size - 1) // 2, self.kernel_size // 2))

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv_1(self._pad(x * x_mask)))
        x = self.conv_2(self._pad(x * x_mask))
        return x * x_mask


class AttentionEncoder(nn.Module):
    """Post-LN VITS transformer encoder (relative-position self-attention + conv FFN), (B, C, T) in/out."""

    def __init__(self, hidden_channels: int, filter_channels: int, n_heads: int, n_layers: int,
                 kernel_size: int = 1, window_size: int = 4):
        super().__init__()
        self.n_layers = n_layers
        self.attn_layers = nn.ModuleList(
            RelativeMultiHeadAttention(hidden_channels, hidden_channels, n_heads, window_size) for _ in range(n_layers)
        )
        self.norm_layers_1 = nn.ModuleList(ChannelLayerNorm(hidden_channels) for _ in range(n_layers))
        self.ffn_layers = nn.ModuleList(
            ConvFFN(hidden_channels, hidden_channels, filter_channels, kernel_size) for _ in range(n_layers)
        )
        self.norm_layers_2 = nn.ModuleList(ChannelLayerNorm(hidden_channels) for _ in range(n_layers))

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor) -> torch.Tensor:
        attn_mask = x_mask.unsqueeze(2) * x_mask.unsqueeze(-1)  # (B, 1, T, T)
        x = x * x_mask
        for attn, norm1, ffn, norm2 in zip(self.attn_layers, self.norm_layers_1, self.ffn_layers, self.norm_layers_2):
            x = norm1(x + attn(x, x, attn_mask))
            x = norm2(x + ffn(x, x_mask))
        return x * x_mask


# --------------------------------------------------------------------------------------------
# MRTE and the prior text encoder (official module/mrte_model.py MRTE, module/models.py TextEncoder)


class MRTE(nn.Module):
    """Multi-reference timbre encoder: SSL frames cross-attend to phones, plus the global style vector."""

    def __init__(self, content_channels: int = 192, hidden_size: int = 512, out_channels: int = 192, n_heads: int = 4):
        super().__init__()
        self.cross_attention = RelativeMultiHeadAttention(hidden_size, hidden_size, n_heads)
        self.c_pre = nn.Conv1d(content_channels, hidden_size, 1)
        self.text_pre = nn.Conv1d(content_channels, hidden_size, 1)
        self.c_post = nn.Conv1d(hidden_size, out_channels, 1)

    def forward(self, ssl_enc, ssl_mask, text, text_mask, ge: torch.Tensor | None) -> torch.Tensor:
        # ssl_enc (B, C, T_ssl), text (B, C, T_text), ge (B, hidden, 1) or None
        attn_mask = text_mask.unsqueeze(2) * ssl_mask.unsqueeze(-1)  # (B, 1, T_ssl, T_text)
        ssl_enc = self.c_pre(ssl_enc * ssl_mask)
        text_enc = self.text_pre(text * text_mask)
        x = self.cross_attention(ssl_enc * ssl_mask, text_enc * text_mask, attn_mask) + ssl_enc
        if ge is not None:
            x = x + ge
        return self.c_post(x * ssl_mask)


class TextEncoder(nn.Module):
    """Prior encoder ``enc_p``: SSL features + phones (+ style vector via MRTE) -> prior mean/log-std.

    ``forward`` returns ``(x, m, logs, mask)``, each over the (speed-resampled) frame axis.
    """

    def __init__(self, out_channels: int, hidden_channels: int, filter_channels: int, n_heads: int,
                 n_layers: int, kernel_size: int, n_symbols: int, ssl_dim: int = 768,
                 mrte_hidden: int = 512, mrte_heads: int = 4):
        super().__init__()
        self.out_channels = out_channels
        self.ssl_proj = nn.Conv1d(ssl_dim, hidden_channels, 1)
        self.encoder_ssl = AttentionEncoder(hidden_channels, filter_channels, n_heads, n_layers // 2, kernel_size)
        self.encoder_text = AttentionEncoder(hidden_channels, filter_channels, n_heads, n_layers, kernel_size)
        self.text_embedding = nn.Embedding(n_symbols, hidden_channels)
        self.mrte = MRTE(hidden_channels, mrte_hidden, hidden_channels, mrte_heads)
        self.encoder2 = AttentionEncoder(hidden_channels, filter_channels, n_heads, n_layers // 2, kernel_size)
        self.proj = nn.Conv1d(hidden_channels, out_channels * 2, 1)

    def forward(self, y, y_lengths, text, text_lengths, ge, speed: float = 1.0):
        # y (B, ssl_dim, T) at 50 Hz; text (B, P) phone ids; ge (B, mrte_hidden, 1) or None
        y_mask = sequence_mask(y_lengths, y.size(2)).unsqueeze(1).to(y.dtype)  # (B, 1, T)
        y = self.ssl_proj(y * y_mask) * y_mask
        y = self.encoder_ssl(y * y_mask, y_mask)

        text_mask = sequence_mask(text_lengths, text.size(1)).unsqueeze(1).to(y.dtype)  # (B, 1, P)
        t = self.text_embedding(text).transpose(1, 2)  # (B, hidden, P)
        t = self.encoder_text(t * text_mask, text_mask)
        y = self.mrte(y, y_mask, t, text_mask, ge)
        y = self.encoder2(y * y_mask, y_mask)

        if speed != 1:
            y = F.interpolate(y, size=int(y.shape[-1] / speed) + 1, mode="linear")
            y_mask = F.interpolate(y_mask, size=y.shape[-1], mode="nearest")
        stats = self.proj(y) * y_mask  # (B, 2*out, T')
        m, logs = torch.split(stats, self.out_channels, dim=1)
        return y, m, logs, y_mask


# --------------------------------------------------------------------------------------------
# MelStyleEncoder (official module/modules.py MelStyleEncoder)


class _Linear(nn.Module):
    """A Linear stored under ``.fc`` (official ``LinearNorm`` key layout)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class _Mish(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.tanh(F.softplus(x))


class _ConvNorm(nn.Module):
    """A "same"-padded Conv1d stored under ``.conv``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, padding=(kernel_size - 1) // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class Conv1dGLU(nn.Module):
    """Residual gated conv: ``x + a * sigmoid(b)`` with ``(a, b) = conv(x)``."""

    def __init__(self, channels: int, kernel_size: int):
        super().__init__()
        self.channels = channels
        self.conv1 = _ConvNorm(channels, 2 * channels, kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = torch.split(self.conv1(x), self.channels, dim=1)
        return x + a * torch.sigmoid(b)


class StyleAttention(nn.Module):
    """Multi-head self-attention of MelStyleEncoder: Linear q/k/v, scores / sqrt(d_model), residual."""

    def __init__(self, n_head: int, d_model: int):
        super().__init__()
        self.n_head = n_head
        self.d_k = d_model // n_head
        self.temperature = math.sqrt(d_model)  # sqrt(d_model), not sqrt(d_k): official quirk
        self.w_qs = nn.Linear(d_model, n_head * self.d_k)
        self.w_ks = nn.Linear(d_model, n_head * self.d_k)
        self.w_vs = nn.Linear(d_model, n_head * self.d_k)
        self.fc = nn.Linear(n_head * self.d_k, d_model)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        # x (B, T, d_model); mask (B, T, T) bool, True = masked
        b, t, _ = x.shape
        h, dk = self.n_head, self.d_k

        def heads(z: torch.Tensor) -> torch.Tensor:  # (B, T, h*dk) -> (h*B, T, dk)
            return z.view(b, t, h, dk).permute(2, 0, 1, 3).contiguous().view(-1, t, dk)

        q, k, v = heads(self.w_qs(x)), heads(self.w_ks(x)), heads(self.w_vs(x))
        attn = torch.bmm(q, k.transpose(1, 2)) / self.temperature  # (h*B, T, T)
        if mask is not None:
            attn = attn.masked_fill(mask.repeat(h, 1, 1), float("-inf"))
        attn = torch.softmax(attn, dim=2)
        out = torch.bmm(attn, v).view(h, b, t, dk).permute(1, 2, 0, 3).contiguous().view(b, t, -1)
        return self.fc(out) + x


class MelStyleEncoder(nn.Module):
    """Reference encoder ``ref_enc``: spectrogram frames (B, n_bins, F) -> style vector (B, out_dim, 1)."""

    def __init__(self, in_dim: int, out_dim: int, hidden: int = 128, kernel_size: int = 5, n_head: int = 2):
        super().__init__()
        # Identity placeholders keep the official Sequential indices (spectral.0 / spectral.3).
        self.spectral = nn.Sequential(
            _Linear(in_dim, hidden), _Mish(), nn.Identity(), _Linear(hidden, hidden), _Mish(), nn.Identity()
        )
        self.temporal = nn.Sequential(Conv1dGLU(hidden, kernel_size), Conv1dGLU(hidden, kernel_size))
        self.slf_attn = StyleAttention(n_head, hidden)
        self.fc = _Linear(hidden, out_dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        # x (B, n_bins, F); mask (B, 1, F), 1 on valid frames
        x = x.transpose(1, 2)  # (B, F, n_bins)
        if mask is None:
            mask = torch.ones(x.shape[0], 1, x.shape[1], dtype=x.dtype, device=x.device)
        pad = (mask.int() == 0).squeeze(1)  # (B, F) True on padding
        attn_mask = pad.unsqueeze(1).expand(-1, x.shape[1], -1)  # (B, F, F)

        x = self.spectral(x)
        x = self.temporal(x.transpose(1, 2)).transpose(1, 2)  # (B, F, hidden)
        x = x.masked_fill(pad.unsqueeze(-1), 0)
        x = self.fc(self.slf_attn(x, attn_mask))  # (B, F, out_dim)

        # average over valid frames in float32: divide first, then sum (official order)
        valid = (~pad).sum(dim=1).unsqueeze(1)  # (B, 1)
        dtype = x.dtype
        x = x.masked_fill(pad.unsqueeze(-1), 0).float()
        w = torch.div(x, valid.unsqueeze(1)).sum(dim=1).to(dtype)  # (B, out_dim)
        return w.unsqueeze(-1)


# --------------------------------------------------------------------------------------------
# semantic quantizer (official module/quantize.py ResidualVectorQuantizer; SynthesizerTrn.extract_latent)


class _Codebook(nn.Module):
    def __init__(self, dim: int, bins: int):
        super().__init__()
        self.register_buffer("inited", torch.ones(1))
        self.register_buffer("cluster_size", torch.zeros(bins))
        self.register_buffer("embed", torch.zeros(bins, dim))
        self.register_buffer("embed_avg", torch.zeros(bins, dim))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        # x (N, dim) -> nearest code ids (N,) by squared Euclidean distance
        embed = self.embed.t()
        dist = -(x.pow(2).sum(1, keepdim=True) - 2 * x @ embed + embed.pow(2).sum(0, keepdim=True))
        return dist.max(dim=-1).indices

    def decode(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embed)


class _VQLayer(nn.Module):
    def __init__(self, dim: int, bins: int):
        super().__init__()
        self._codebook = _Codebook(dim, bins)


class _LayerList(nn.Module):
    def __init__(self, dim: int, bins: int, n_q: int):
        super().__init__()
        self.layers = nn.ModuleList(_VQLayer(dim, bins) for _ in range(n_q))


class SemanticQuantizer(nn.Module):
    """Residual VQ over SSL features (keys ``vq.layers.N._codebook.*``); GPT-SoVITS uses one codebook."""

    def __init__(self, dim: int = 768, bins: int = 1024, n_q: int = 1):
        super().__init__()
        self.vq = _LayerList(dim, bins, n_q)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        # x (B, dim, T) -> codes (n_q, B, T)
        b, d, t = x.shape
        residual = x.transpose(1, 2)  # (B, T, dim)
        codes = []
        for layer in self.vq.layers:
            ids = layer._codebook.encode(residual.reshape(-1, d)).view(b, t)
            residual = residual - layer._codebook.decode(ids)
            codes.append(ids)
        return torch.stack(codes)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        # codes (n_q, B, T) -> (B, dim, T)
        out = None
        for i, ids in enumerate(codes):
            q = self.vq.layers[i]._codebook.decode(ids)
            out = q if out is None else out + q
        return out.transpose(1, 2)


# --------------------------------------------------------------------------------------------
# WaveNet and the reverse normalising flow (official module/modules.py WN, ResidualCouplingLayer, Flip;
# module/models.py ResidualCouplingBlock)


class WN(nn.Module):
    """Gated WaveNet stack (weight-normed convs) with optional global conditioning ``g``."""

    def __init__(self, hidden_channels: int, kernel_size: int, dilation_rate: int, n_layers: int, gin_channels: int = 0):
        super().__init__()
        if kernel_size % 2 != 1:
            raise ValueError("WN kernel_size must be odd")
        self.hidden_channels = hidden_channels
        self.n_layers = n_layers
        self.in_layers = nn.ModuleList()
        self.res_skip_layers = nn.ModuleList()
        if gin_channels:
            self.cond_layer = mark_weight_norm(nn.Conv1d(gin_channels, 2 * hidden_channels * n_layers, 1))
        for i in range(n_layers):
            dilation = dilation_rate**i
            padding = (kernel_size * dilation - dilation) // 2
            self.in_layers.append(mark_weight_norm(
                nn.Conv1d(hidden_channels, 2 * hidden_channels, kernel_size, dilation=dilation, padding=padding)))
            res_skip = 2 * hidden_channels if i < n_layers - 1 else hidden_channels
            self.res_skip_layers.append(mark_weight_norm(nn.Conv1d(hidden_channels, res_skip, 1)))

    def forward(self, x: torch.Tensor, x_mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        # x (B, hidden, T); g (B, gin, 1) or None
        hc = self.hidden_channels
        output = torch.zeros_like(x)
        if g is not None:
            g = self.cond_layer(g)  # (B, 2*hidden*n_layers, 1)
        for i in range(self.n_layers):
            x_in = self.in_layers[i](x)
            g_l = g[:, i * 2 * hc : (i + 1) * 2 * hc, :] if g is not None else torch.zeros_like(x_in)
            z = x_in + g_l
            acts = torch.tanh(z[:, :hc, :]) * torch.sigmoid(z[:, hc:, :])
            res_skip = self.res_skip_layers[i](acts)
            if i < self.n_layers - 1:
                x = (x + res_skip[:, :hc, :]) * x_mask
                output = output + res_skip[:, hc:, :]
            else:
                output = output + res_skip
        return output * x_mask


class ResidualCouplingLayer(nn.Module):
    """Affine coupling (mean-only by default): the second half is shifted by a WN of the first half."""

    def __init__(self, channels: int, hidden_channels: int, kernel_size: int, dilation_rate: int,
                 n_layers: int, gin_channels: int = 0, mean_only: bool = True):
        super().__init__()
        self.half_channels = channels // 2
        self.mean_only = mean_only
        self.pre = nn.Conv1d(self.half_channels, hidden_channels, 1)
        self.enc = WN(hidden_channels, kernel_size, dilation_rate, n_layers, gin_channels)
        self.post = nn.Conv1d(hidden_channels, self.half_channels * (2 - mean_only), 1)

    def reverse(self, x: torch.Tensor, x_mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        x0, x1 = torch.split(x, [self.half_channels] * 2, 1)
        h = self.pre(x0) * x_mask
        h = self.enc(h, x_mask, g=g)
        stats = self.post(h) * x_mask
        if self.mean_only:
            m, logs = stats, torch.zeros_like(stats)
        else:
            m, logs = torch.split(stats, [self.half_channels] * 2, 1)
        x1 = (x1 - m) * torch.exp(-logs) * x_mask
        return torch.cat([x0, x1], 1)


class Flip(nn.Module):
    """Reverse the channel order (no parameters; keeps the official flow indices)."""

    def reverse(self, x: torch.Tensor, x_mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        return torch.flip(x, [1])


class ResidualCouplingBlock(nn.Module):
    """``n_flows`` x (coupling layer, flip); only the reverse (sampling) direction is implemented."""

    def __init__(self, channels: int, hidden_channels: int, kernel_size: int, dilation_rate: int,
                 n_layers: int, n_flows: int = 4, gin_channels: int = 0):
        super().__init__()
        self.flows = nn.ModuleList()
        for _ in range(n_flows):
            self.flows.append(ResidualCouplingLayer(channels, hidden_channels, kernel_size, dilation_rate,
                                                    n_layers, gin_channels, mean_only=True))
            self.flows.append(Flip())

    def reverse(self, x: torch.Tensor, x_mask: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        for flow in reversed(self.flows):
            x = flow.reverse(x, x_mask, g=g)
        return x
