"""SoVITS v3/v4 acoustic model (official ``GPT_SoVITS/module/models.py``, ``SynthesizerTrnV3``).

Semantic tokens + phones + a reference spectrogram -> 512-d frame features at the mel rate
(``decode_encp``), which condition the CFM (``cfm``) that generates a 100-band log-mel.
The text encoder, style encoder, quantizer and WaveNet are the shared SoVITS modules; parameter
names follow the official state dict. No flow and no HiFi-GAN decoder: a separate vocoder renders audio.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from engine.models.cfm import CFM
from engine.models.dit import DiT, DiTDims
from engine.models.sovits_modules import WN, MelStyleEncoder, SemanticQuantizer, TextEncoder, sequence_mask

SSL_DIM = 768
CODEBOOK_SIZE = 1024
REF_BINS = 704  # the style encoder reads the first 704 of 1025 linear-frequency bins
N_SYMBOLS = 732  # SynthesizerTrnV3 builds its TextEncoder without `version`: always the v2 table
FEATURE_DIM = 512  # "inter_channels2": bridge / wns1 / DiT condition width
MRTE_HIDDEN = 512

# v3: mel at 24000/256 = 93.75 fps = 3.75 frames per 25 Hz token; v4: 32000/320 = 100 fps = 4 per token.
FEATURE_SCALE = {"v3": 1.875, "v4": 2.0}  # 50 Hz encoder frames -> mel frames (nearest)
FRAMES_PER_TOKEN = {"v3": 3.875, "v4": 4.0}  # the official wns1 length factor (3.875, not 3.75, for v3)


@dataclass(frozen=True)
class SoVITSV3Dims:
    version: str  # "v3" | "v4": only changes the frame-rate factors
    inter_channels: int = 192
    hidden_channels: int = 192
    filter_channels: int = 768
    n_heads: int = 2
    n_layers: int = 6
    kernel_size: int = 3
    gin_channels: int = 512
    semantic_frame_rate: str = "25hz"
    wns1_hidden: int = 512
    wns1_kernel: int = 5
    wns1_layers: int = 8
    dit: DiTDims = DiTDims()

    def __post_init__(self) -> None:
        if self.version not in FEATURE_SCALE:
            raise ValueError(f"SoVITSV3Dims covers v3/v4, not {self.version!r}")
        if self.semantic_frame_rate not in ("25hz", "50hz"):
            raise ValueError(f"semantic_frame_rate must be '25hz' or '50hz', got {self.semantic_frame_rate!r}")

    @classmethod
    def from_hparams(cls, hps: Mapping[str, Any], version: str, **sizes: Any) -> "SoVITSV3Dims":
        """enc_p sizes from ``hps["model"]``; wns1/DiT sizes (read from the weights) as keyword arguments."""
        m = hps["model"]
        return cls(
            version=version,
            inter_channels=int(m["inter_channels"]),
            hidden_channels=int(m["hidden_channels"]),
            filter_channels=int(m["filter_channels"]),
            n_heads=int(m["n_heads"]),
            n_layers=int(m["n_layers"]),
            kernel_size=int(m["kernel_size"]),
            gin_channels=int(m["gin_channels"]),
            semantic_frame_rate="25hz",  # TTS.py forces it
            **sizes,
        )


class FeatureEncoder(nn.Module):
    """The official ``models.Encoder`` used as ``wns1``: 1x1 conv -> conditioned WaveNet -> 1x1 conv, masked."""

    def __init__(self, in_channels: int, out_channels: int, hidden: int, kernel: int, dilation_rate: int,
                 n_layers: int, gin_channels: int):
        super().__init__()
        self.pre = nn.Conv1d(in_channels, hidden, 1)
        self.enc = WN(hidden, kernel, dilation_rate, n_layers, gin_channels=gin_channels)
        self.proj = nn.Conv1d(hidden, out_channels, 1)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        mask = sequence_mask(lengths, x.size(2)).unsqueeze(1).to(x.dtype)  # (B, 1, T)
        x = self.pre(x) * mask
        x = self.enc(x, mask, g=g)
        return self.proj(x) * mask


class SynthesizerTrnV3(nn.Module):
    """Inference half of the v3/v4 model.

    Responsibilities: prompt tokens from SSL features (``extract_latent``), the style vector and
    the CFM conditioning features (``decode_encp``); the CFM itself is ``self.cfm``.
    """

    def __init__(self, dims: SoVITSV3Dims):
        super().__init__()
        self.dims = dims
        self.enc_p = TextEncoder(dims.inter_channels, dims.hidden_channels, dims.filter_channels, dims.n_heads,
                                 dims.n_layers, dims.kernel_size, N_SYMBOLS, SSL_DIM, MRTE_HIDDEN)
        self.ref_enc = MelStyleEncoder(REF_BINS, dims.gin_channels)
        if dims.semantic_frame_rate == "25hz":
            self.ssl_proj = nn.Conv1d(SSL_DIM, SSL_DIM, 2, stride=2)
        else:
            self.ssl_proj = nn.Conv1d(SSL_DIM, SSL_DIM, 1, stride=1)
        self.quantizer = SemanticQuantizer(SSL_DIM, CODEBOOK_SIZE, 1)
        self.bridge = nn.Sequential(nn.Conv1d(dims.inter_channels, FEATURE_DIM, 1), nn.LeakyReLU())
        self.wns1 = FeatureEncoder(FEATURE_DIM, FEATURE_DIM, dims.wns1_hidden, dims.wns1_kernel, 1,
                                   dims.wns1_layers, dims.gin_channels)
        self.cfm = CFM(DiT(dims.dit))

    def extract_latent(self, ssl: torch.Tensor) -> torch.Tensor:
        """SSL features (B, 768, T_h) at 50 Hz -> codes (B, 1, T_h // 2)."""
        return self.quantizer.encode(self.ssl_proj(ssl)).transpose(0, 1)

    def style_vector(self, refer: torch.Tensor) -> torch.Tensor:
        """Reference linear spectrogram (1, 1025, F) -> ge (1, gin, 1)."""
        mask = torch.ones(refer.shape[0], 1, refer.shape[2], dtype=refer.dtype, device=refer.device)
        return self.ref_enc(refer[:, :REF_BINS] * mask, mask)

    @torch.no_grad()
    def decode_encp(
        self,
        codes: torch.Tensor,  # (1, 1, N) semantic tokens at 25 Hz
        text: torch.Tensor,  # (1, P) phone ids
        refer: torch.Tensor,  # (1, 1025, F) reference spectrogram (ignored when ge is given)
        ge: torch.Tensor | None = None,  # (1, gin, 1)
        speed: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # -> features (1, 512, T_mel), ge
        if ge is None:
            ge = self.style_vector(refer)
        n = codes.size(2)
        factor = FRAMES_PER_TOKEN[self.dims.version]
        frames = int(n * factor) if speed == 1 else int(n * factor / speed) + 1
        y_lengths = torch.tensor([n * 2], device=codes.device)
        text_lengths = torch.tensor([text.size(-1)], device=text.device)
        quantized = self.quantizer.decode(codes)  # (1, 768, N)
        if self.dims.semantic_frame_rate == "25hz":
            quantized = F.interpolate(quantized, scale_factor=2, mode="nearest")  # 50 Hz
        x = self.enc_p(quantized, y_lengths, text, text_lengths, ge, speed)[0]  # (1, hidden, T50/speed)
        fea = self.bridge(x)
        # scale_factor (not size): nearest picks floor(j / s), which differs from a size-based index map
        fea = F.interpolate(fea, scale_factor=FEATURE_SCALE[self.dims.version], mode="nearest")
        fea = self.wns1(fea, torch.tensor([frames], device=codes.device), ge)
        return fea, ge
