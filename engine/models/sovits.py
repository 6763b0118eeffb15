"""SoVITS acoustic model for v1 / v2 / v2Pro / v2ProPlus (official ``GPT_SoVITS/module/models.py``,
``SynthesizerTrn``): semantic tokens + phones -> 32 kHz audio.

``SynthesizerTrn`` holds the inference half of the official model (no posterior encoder ``enc_q``),
with the official parameter names. Sizes come from :class:`SoVITSDims`, read from the checkpoint's hps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from engine.models.hifigan import Generator
from engine.models.sovits_modules import MelStyleEncoder, ResidualCouplingBlock, SemanticQuantizer, TextEncoder
from engine.versions import DIRECT_VERSIONS, PRO_VERSIONS

SSL_DIM = 768  # chinese-hubert-base hidden size, hard-coded in the official model
CODEBOOK_SIZE = 1024
SV_DIM = 20480  # ERes2NetV2 forward3 output: 2048 channels x 10 frequency rows
MRTE_HIDDEN = 512
V2_REF_BINS = 704  # v2+ style encoder sees only the first 704 of 1025 linear-frequency bins


@dataclass(frozen=True)
class SoVITSDims:
    """Architecture sizes of a v1/v2/v2Pro/v2ProPlus SynthesizerTrn (from ``hps["model"]``/``hps["data"]``)."""

    version: str  # "v1" | "v2" | "v2Pro" | "v2ProPlus"
    n_symbols: int  # phone table size: 322 (v1) or 732
    spec_channels: int = 1025  # filter_length // 2 + 1
    inter_channels: int = 192
    hidden_channels: int = 192
    filter_channels: int = 768
    n_heads: int = 2
    n_layers: int = 6
    kernel_size: int = 3
    resblock: str = "1"
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    upsample_rates: tuple[int, ...] = (10, 8, 2, 2, 2)
    upsample_initial_channel: int = 512
    upsample_kernel_sizes: tuple[int, ...] = (16, 16, 8, 2, 2)
    gin_channels: int = 512
    semantic_frame_rate: str = "25hz"
    sv_dim: int = SV_DIM  # v2Pro*: speaker-embedding length (20480 officially; read from sv_emb.weight)

    def __post_init__(self) -> None:
        if self.version not in DIRECT_VERSIONS:
            raise ValueError(f"SoVITSDims covers v1/v2/v2Pro/v2ProPlus, not {self.version!r}")
        if self.resblock != "1":
            raise ValueError(f"only resblock '1' is supported (official configs), got {self.resblock!r}")
        if self.semantic_frame_rate not in ("25hz", "50hz"):
            raise ValueError(f"semantic_frame_rate must be '25hz' or '50hz', got {self.semantic_frame_rate!r}")

    @property
    def is_pro(self) -> bool:
        return self.version in PRO_VERSIONS

    @property
    def ref_bins(self) -> int:
        """Spectrogram bins the style encoder reads (all for v1, the first 704 for v2+)."""
        return self.spec_channels if self.version == "v1" else V2_REF_BINS

    @property
    def samples_per_frame(self) -> int:
        """Output samples per 50 Hz latent frame (640 at 32 kHz)."""
        n = 1
        for u in self.upsample_rates:
            n *= u
        return n

    @classmethod
    def from_hparams(cls, hps: Mapping[str, Any], version: str, n_symbols: int, sv_dim: int = SV_DIM) -> "SoVITSDims":
        """Dims from an official hps dict (``{"data": ..., "model": ...}``) plus the resolved version."""
        model, data = hps["model"], hps["data"]

        def tup(v):
            return tuple(tuple(x) if isinstance(x, (list, tuple)) else x for x in v)

        return cls(
            version=version,
            n_symbols=int(n_symbols),
            spec_channels=int(data["filter_length"]) // 2 + 1,
            inter_channels=int(model["inter_channels"]),
            hidden_channels=int(model["hidden_channels"]),
            filter_channels=int(model["filter_channels"]),
            n_heads=int(model["n_heads"]),
            n_layers=int(model["n_layers"]),
            kernel_size=int(model["kernel_size"]),
            resblock=str(model["resblock"]),
            resblock_kernel_sizes=tup(model["resblock_kernel_sizes"]),
            resblock_dilation_sizes=tup(model["resblock_dilation_sizes"]),
            upsample_rates=tup(model["upsample_rates"]),
            upsample_initial_channel=int(model["upsample_initial_channel"]),
            upsample_kernel_sizes=tup(model["upsample_kernel_sizes"]),
            gin_channels=int(model["gin_channels"]),
            semantic_frame_rate="25hz",  # TTS.init_vits_weights forces 25hz
            sv_dim=int(sv_dim),
        )


class SynthesizerTrn(nn.Module):
    """Inference SoVITS (v1/v2/v2Pro/v2ProPlus): prompt tokens from SSL features, and decode to audio.

    Responsibilities: ``extract_latent`` (SSL -> codes) and ``decode`` (codes + phones + reference
    spectrograms [+ speaker embeddings] -> waveform). No I/O, no device policy.
    """

    def __init__(self, dims: SoVITSDims):
        super().__init__()
        self.dims = dims
        self.enc_p = TextEncoder(dims.inter_channels, dims.hidden_channels, dims.filter_channels, dims.n_heads,
                                 dims.n_layers, dims.kernel_size, dims.n_symbols, SSL_DIM, MRTE_HIDDEN)
        self.dec = Generator(dims.inter_channels, dims.resblock_kernel_sizes, dims.resblock_dilation_sizes,
                             dims.upsample_rates, dims.upsample_initial_channel, dims.upsample_kernel_sizes,
                             gin_channels=dims.gin_channels, is_bias=False)
        self.flow = ResidualCouplingBlock(dims.inter_channels, dims.hidden_channels, 5, 1, 4,
                                          gin_channels=dims.gin_channels)
        self.ref_enc = MelStyleEncoder(dims.ref_bins, dims.gin_channels)
        if dims.semantic_frame_rate == "25hz":
            self.ssl_proj = nn.Conv1d(SSL_DIM, SSL_DIM, 2, stride=2)
        else:
            self.ssl_proj = nn.Conv1d(SSL_DIM, SSL_DIM, 1, stride=1)
        self.quantizer = SemanticQuantizer(SSL_DIM, CODEBOOK_SIZE, 1)
        if dims.is_pro:
            self.sv_emb = nn.Linear(dims.sv_dim, dims.gin_channels)
            self.ge_to512 = nn.Linear(dims.gin_channels, MRTE_HIDDEN)
            self.prelu = nn.PReLU(num_parameters=dims.gin_channels)

    # ---- prompt tokens ------------------------------------------------------------------

    def extract_latent(self, ssl: torch.Tensor) -> torch.Tensor:
        """SSL features (B, 768, T_h) at 50 Hz -> codes (B, 1, T_h // 2) (official layout [B, n_q, T])."""
        codes = self.quantizer.encode(self.ssl_proj(ssl))  # (n_q, B, T)
        return codes.transpose(0, 1)

    # ---- style vector -------------------------------------------------------------------

    def reference_style(self, spec: torch.Tensor, sv: torch.Tensor | None = None) -> torch.Tensor:
        """One reference: spectrogram (1, 1025, F) [+ SV embedding (1, 20480)] -> ge (1, gin, 1)."""
        mask = torch.ones(spec.shape[0], 1, spec.shape[2], dtype=spec.dtype, device=spec.device)
        ge = self.ref_enc(spec[:, : self.dims.ref_bins] * mask, mask)
        if self.dims.is_pro:
            if sv is None:
                raise ValueError(f"{self.dims.version} needs a speaker-verification embedding per reference")
            ge = ge + self.sv_emb(sv).unsqueeze(-1)
            ge = self.prelu(ge)
        return ge

    def style_vector(self, refer: Sequence[torch.Tensor], sv_emb: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        """Several references -> the mean of their ge (the official aux-reference averaging)."""
        if not refer:
            raise ValueError("decode needs at least one reference spectrogram")
        if self.dims.is_pro and (sv_emb is None or len(sv_emb) != len(refer)):
            raise ValueError(f"{self.dims.version} needs one SV embedding per reference spectrogram")
        ges = [self.reference_style(s, sv_emb[i] if self.dims.is_pro else None) for i, s in enumerate(refer)]
        return torch.stack(ges, 0).mean(0)

    # ---- decode -------------------------------------------------------------------------

    def prior(self, codes: torch.Tensor, text: torch.Tensor, ge: torch.Tensor, speed: float = 1.0):
        """Codes (n_q=1, 1, N) + target phones (1, P) + ge -> (x, m_p, logs_p, y_mask) at 50 Hz / speed."""
        y_lengths = torch.tensor([codes.size(2) * 2], device=codes.device)
        text_lengths = torch.tensor([text.size(-1)], device=text.device)
        quantized = self.quantizer.decode(codes)  # (1, 768, N)
        if self.dims.semantic_frame_rate == "25hz":
            quantized = F.interpolate(quantized, size=int(quantized.shape[-1] * 2), mode="nearest")
        ge_enc = self.ge_to512(ge.transpose(2, 1)).transpose(2, 1) if self.dims.is_pro else ge
        return self.enc_p(quantized, y_lengths, text, text_lengths, ge_enc, speed)

    def decode(
        self,
        codes: torch.Tensor,
        text: torch.Tensor,
        refer: Sequence[torch.Tensor],
        noise_scale: float = 0.5,
        speed: float = 1.0,
        sv_emb: Sequence[torch.Tensor] | None = None,
        noise: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Semantic codes (1, 1, N) + phones (1, P) -> audio (1, 1, 640 * T_latent).

        ``refer``: one or more reference spectrograms (main + aux), ``sv_emb``: one SV embedding per
        reference (v2Pro*). ``noise`` replaces the prior noise draw (shape of ``m_p``); otherwise it
        is drawn with ``generator``.
        """
        ge = self.style_vector(refer, sv_emb)
        _, m_p, logs_p, y_mask = self.prior(codes, text, ge, speed)
        if noise is None:
            noise = torch.randn(m_p.shape, generator=generator, device=m_p.device, dtype=m_p.dtype)
        elif noise.shape != m_p.shape:
            raise ValueError(f"noise has shape {tuple(noise.shape)}, expected {tuple(m_p.shape)}")
        z_p = m_p + noise * torch.exp(logs_p) * noise_scale
        z = self.flow.reverse(z_p, y_mask, g=ge)
        return self.dec(z * y_mask, g=ge)
