"""v3/v4 log-mel spectrograms and their normalisation (official ``TTS.py`` ``mel_fn``/``mel_fn_v4``,
``norm_spec``/``denorm_spec``): pure functions.

``mel_spectrogram`` reproduces the official ``mel_spectrogram_torch`` (reflect padding of
(n_fft - hop)/2 per side, ``center=False`` STFT with a periodic Hann window, magnitude
``sqrt(re^2 + im^2 + 1e-8)``, Slaney mel filterbank, ``log(clamp(., 1e-5))``). The filterbank is
computed here, in the same float64-then-float32 steps as ``librosa.filters.mel``, so librosa is
not a dependency (a test checks the two agree).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from engine.audio import resample_sinc, stft_magnitude

SPEC_MIN = -12.0  # official spec_min / spec_max of the CFM mel normalisation
SPEC_MAX = 2.0


@dataclass(frozen=True)
class MelParams:
    n_fft: int
    hop: int
    win: int
    n_mels: int
    sampling_rate: int
    fmin: float = 0.0
    fmax: float | None = None


# The two mel front ends of TTS.py (mel_fn for v3, mel_fn_v4 for v4).
MEL_V3 = MelParams(n_fft=1024, hop=256, win=1024, n_mels=100, sampling_rate=24000)
MEL_V4 = MelParams(n_fft=1280, hop=320, win=1280, n_mels=100, sampling_rate=32000)
MEL_PARAMS = {"v3": MEL_V3, "v4": MEL_V4}


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    """Slaney mel scale: linear below 1 kHz, logarithmic above."""
    f = np.asanyarray(f, dtype=np.float64)
    f_sp = 200.0 / 3
    mels = f / f_sp
    min_log_hz, min_log_mel, logstep = 1000.0, 1000.0 / f_sp, np.log(6.4) / 27.0
    return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, mels)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asanyarray(m, dtype=np.float64)
    f_sp = 200.0 / 3
    freqs = f_sp * m
    min_log_hz, min_log_mel, logstep = 1000.0, 1000.0 / f_sp, np.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), freqs)


@functools.lru_cache(maxsize=16)
def slaney_mel_filterbank(sampling_rate: int, n_fft: int, n_mels: int, fmin: float = 0.0,
                          fmax: float | None = None) -> np.ndarray:
    """(n_mels, n_fft//2 + 1) float32 triangles with Slaney area normalisation (read-only array)."""
    if fmax is None:
        fmax = sampling_rate / 2.0
    fftfreqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sampling_rate)
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = np.subtract.outer(mel_f, fftfreqs)
    weights = np.zeros((n_mels, 1 + n_fft // 2), dtype=np.float32)
    for i in range(n_mels):
        lower = -ramps[i] / fdiff[i]
        upper = ramps[i + 2] / fdiff[i + 1]
        weights[i] = np.maximum(0, np.minimum(lower, upper))
    enorm = 2.0 / (mel_f[2 : n_mels + 2] - mel_f[:n_mels])
    weights *= enorm[:, np.newaxis]
    weights.setflags(write=False)
    return weights


@functools.lru_cache(maxsize=16)
def _mel_basis(p: MelParams, dtype: torch.dtype, device: str) -> torch.Tensor:
    basis = torch.from_numpy(np.array(slaney_mel_filterbank(p.sampling_rate, p.n_fft, p.n_mels, p.fmin, p.fmax)))
    return basis.to(dtype=dtype, device=device)


def mel_spectrogram(audio: torch.Tensor, p: MelParams) -> torch.Tensor:
    """(B, samples) float audio at ``p.sampling_rate`` -> (B, n_mels, samples // hop) natural-log mel."""
    if audio.dim() != 2:
        raise ValueError(f"mel_spectrogram expects (batch, samples), got shape {tuple(audio.shape)}")
    pad = int((p.n_fft - p.hop) / 2)
    if audio.shape[-1] <= pad:
        raise ValueError(f"audio of {audio.shape[-1]} samples is too short for a {p.n_fft}-point mel")
    mag = stft_magnitude(audio, p.n_fft, p.hop, p.win)  # (B, F, frames)
    return torch.log(torch.clamp(torch.matmul(_mel_basis(p, audio.dtype, str(audio.device)), mag), min=1e-5))


def norm_spec(x: torch.Tensor) -> torch.Tensor:
    """log-mel -> the CFM's [-1, 1] scale."""
    return (x - SPEC_MIN) / (SPEC_MAX - SPEC_MIN) * 2 - 1


def denorm_spec(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`norm_spec` (the vocoder's input scale)."""
    return (x + 1) / 2 * (SPEC_MAX - SPEC_MIN) + SPEC_MIN


def reference_mel(audio: torch.Tensor, sr: int, version: str) -> torch.Tensor:
    """Reference clip (channels, samples) at ``sr`` -> normalised mel prompt (1, 100, frames).

    Stereo is averaged; the clip is resampled to 24 kHz (v3) or 32 kHz (v4) with no amplitude
    normalisation, as ``TTS.using_vocoder_synthesis`` does.
    """
    if version not in MEL_PARAMS:
        raise ValueError(f"reference_mel: version must be 'v3' or 'v4', got {version!r}")
    p = MEL_PARAMS[version]
    audio = audio.float()
    if audio.dim() == 1:
        audio = audio.unsqueeze(0)
    if audio.shape[0] == 2:
        audio = audio.mean(0).unsqueeze(0)
    audio = resample_sinc(audio, sr, p.sampling_rate)
    return norm_spec(mel_spectrogram(audio, p))
