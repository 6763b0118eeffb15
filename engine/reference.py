"""Reference clip -> what the models need from it (official ``TTS.py`` ``TTS.set_ref_audio``): prompt
semantic tokens, the SoVITS linear spectrogram and, for v2Pro/v2ProPlus, the speaker-verification
embedding.

Responsibilities: validate a clip with typed errors (length, silence, clipping) and turn it into
features with the official numerics. Everything here is a pure function of its inputs; the bounded
cache of prepared references belongs to the caller (:mod:`engine.reference_cache`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from engine.acoustic.hubert import SSL_SAMPLE_RATE, prompt_ssl_features, with_prompt_pad
from engine.audio import (
    SPEC_HOP,
    SPEC_N_FFT,
    SPEC_SAMPLE_RATE,
    SPEC_WIN,
    kaldi_fbank,
    limit_peak,
    linear_spectrogram,
    read_audio,
    resample_sinc,
    resample_soxr,
    resampled_length,
    to_mono,
)
from engine.errors import EngineError, OptionsError, ReferenceAudioError

SV_SAMPLE_RATE = 16000
FIT_MODES = ("error", "trim_pad")
MAX_SAMPLE_PEAK = 64.0  # |sample| above this (+36 dBFS) is no audio at its declared scale (1e30 in a float WAV)


# ---- typed errors ---------------------------------------------------------------------------


class ReferenceLengthError(ReferenceAudioError):
    """The clip is outside the allowed duration (official rule: 3-10 s at 16 kHz)."""

    def __init__(self, seconds: float, min_seconds: float, max_seconds: float, what: str = "reference audio"):
        self.seconds, self.min_seconds, self.max_seconds = seconds, min_seconds, max_seconds
        side = "too long" if seconds > max_seconds else "too short"
        super().__init__(
            f"{what} is {seconds:.2f} s long ({side}); references must be {min_seconds:g}-{max_seconds:g} s. "
            f"Pick another clip, or allow trimming/padding (ReferenceRules(fit='trim_pad'))."
        )


class SilentReferenceError(ReferenceAudioError):
    """The clip holds (almost) no signal."""


class NearEmptyReferenceError(ReferenceAudioError):
    """The clip is mostly silence: too little audible sound to imitate a voice."""


class ClippedReferenceError(ReferenceAudioError):
    """Many samples sit at the clipping level: the recording is distorted."""


# ---- rules ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReferenceRules:
    """How strictly a reference clip is checked. The defaults are the official 3-10 s rule."""

    min_seconds: float = 3.0  # official: 48000 samples at 16 kHz
    max_seconds: float = 10.0  # official: 160000 samples at 16 kHz
    fit: str = "error"  # "error" (official) or "trim_pad": cut to max_seconds / zero-pad to min_seconds
    silence_dbfs: float = -60.0  # whole-clip RMS below this is "silent"
    min_active_seconds: float = 0.5  # less audible sound than this is "near-empty"
    max_clipped_fraction: float = 0.01  # more samples than this at the clipping level is "clipped"

    def __post_init__(self) -> None:
        if self.fit not in FIT_MODES:
            raise OptionsError(f"ReferenceRules.fit must be one of {FIT_MODES}, got {self.fit!r}")
        if not 0 < self.min_seconds <= self.max_seconds:
            raise OptionsError(
                f"ReferenceRules needs 0 < min_seconds <= max_seconds, got {self.min_seconds} and {self.max_seconds}"
            )
        if self.max_seconds > 60:
            raise OptionsError(f"ReferenceRules.max_seconds {self.max_seconds} is over 60 s; use a shorter limit")
        if not 0 < self.max_clipped_fraction <= 1:
            raise OptionsError("ReferenceRules.max_clipped_fraction must be in (0, 1]")

    def bounds_16k(self) -> tuple[int, int]:
        """Allowed length in 16 kHz samples, as the official check measures it."""
        return round(self.min_seconds * SSL_SAMPLE_RATE), round(self.max_seconds * SSL_SAMPLE_RATE)


@dataclass(frozen=True)
class ReferenceClip:
    """A validated mono reference at its native rate (float32 (n,)), plus how it was adjusted."""

    audio: np.ndarray
    sample_rate: int
    original_seconds: float
    adjustment: str = ""  # "", "trimmed" or "padded"

    @property
    def seconds(self) -> float:
        return self.audio.shape[0] / self.sample_rate


# ---- validation -----------------------------------------------------------------------------


def read_reference(source: str | os.PathLike | BinaryIO, rules: ReferenceRules = ReferenceRules()) -> ReferenceClip:
    """Decode (at most ``max_seconds`` + 1 s, so memory stays bounded) and validate a reference."""
    what = f"reference audio {source}" if isinstance(source, (str, os.PathLike)) else "reference audio"
    decoded = read_audio(source, max_seconds=rules.max_seconds + 1.0, truncate=True)
    return check_reference(to_mono(decoded.samples), decoded.sample_rate, rules, what,
                           total_frames=decoded.total_frames)


def check_reference(mono: np.ndarray, sample_rate: int, rules: ReferenceRules = ReferenceRules(),
                    what: str = "reference audio", total_frames: int | None = None) -> ReferenceClip:
    """Apply the length rule (error or trim/pad) and the content checks to a mono clip."""
    if mono.ndim != 1:
        raise ReferenceAudioError(f"{what}: expected mono samples (n,), got shape {mono.shape}")
    if mono.shape[0] == 0:
        raise ReferenceAudioError(f"{what} contains no samples (zero length)")
    if not np.isfinite(mono).all():
        raise ReferenceAudioError(f"{what} contains NaN or infinite samples; re-export it")
    total = mono.shape[0] if total_frames is None else max(total_frames, mono.shape[0])
    seconds = total / sample_rate
    lo16, hi16 = rules.bounds_16k()
    n16 = resampled_length(total, sample_rate, SSL_SAMPLE_RATE)  # length librosa.load(sr=16000) returns
    audio, adjustment = mono.astype(np.float32, copy=False), ""
    if n16 > hi16 or n16 < lo16:
        if rules.fit == "error":
            raise ReferenceLengthError(seconds, rules.min_seconds, rules.max_seconds, what)
        if n16 > hi16:
            audio, adjustment = audio[: int(math.floor(hi16 * sample_rate / SSL_SAMPLE_RATE))], "trimmed"
        else:
            target = int(math.ceil(lo16 * sample_rate / SSL_SAMPLE_RATE))
            audio, adjustment = np.pad(audio, (0, target - audio.shape[0])), "padded"
    elif total > mono.shape[0]:
        raise ReferenceAudioError(f"{what}: only {mono.shape[0]} of {total} samples were decoded")
    _check_content(audio, sample_rate, rules, what)
    return ReferenceClip(np.ascontiguousarray(audio), sample_rate, seconds, adjustment)


def _dbfs(rms: float) -> float:
    return 20.0 * math.log10(rms) if rms > 0 else -math.inf


def _check_content(audio: np.ndarray, sr: int, rules: ReferenceRules, what: str) -> None:
    x = audio.astype(np.float64)
    peak = float(np.max(np.abs(x)))
    if peak > MAX_SAMPLE_PEAK:
        raise ReferenceAudioError(
            f"{what} holds samples of {peak:.3g}; audio samples lie within [-1, 1] (a float file may go a little "
            f"beyond, at most {MAX_SAMPLE_PEAK:g}). The file is not audio at the scale it declares; re-export it"
        )
    level = _dbfs(float(np.sqrt(np.mean(x * x))))
    if level < rules.silence_dbfs:
        raise SilentReferenceError(
            f"{what} is silent (RMS {level:.1f} dBFS, below {rules.silence_dbfs:g} dBFS); record or pick a clip with speech"
        )
    offset = float(np.mean(x))
    sound = _dbfs(float(np.sqrt(np.mean((x - offset) ** 2))))  # what is left without the constant level
    if sound < rules.silence_dbfs:
        raise SilentReferenceError(
            f"{what} is a constant level (DC offset {offset:.3f}) with no sound (RMS {sound:.1f} dBFS without the "
            f"offset, below {rules.silence_dbfs:g} dBFS); record or pick a clip with speech"
        )
    frame = max(1, sr // 50)  # 20 ms frames
    n = x.shape[0] // frame
    if n:
        frames = x[: n * frame].reshape(n, frame)
        frame_db = 10.0 * np.log10(np.maximum(np.mean(frames * frames, axis=1), 1e-20))
        floor = max(rules.silence_dbfs, float(frame_db.max()) - 40.0)
        active = float(np.count_nonzero(frame_db > floor)) * frame / sr
        if active < rules.min_active_seconds:
            raise NearEmptyReferenceError(
                f"{what} is nearly empty: only {active:.2f} s of audible sound (at least "
                f"{rules.min_active_seconds:g} s needed); pick a clip with more speech"
            )
    if peak >= 0.99:
        clipped = float(np.count_nonzero(np.abs(x) >= 0.999 * peak)) / x.shape[0]
        if clipped > rules.max_clipped_fraction:
            raise ClippedReferenceError(
                f"{what} is clipped: {clipped:.1%} of its samples sit at the peak level {peak:.3f} "
                f"(at most {rules.max_clipped_fraction:.1%} allowed); use a recording made at a lower gain"
            )


# ---- features (TTS.py _set_prompt_semantic, _get_ref_spec; sv.py SV.compute_embedding3) -------


def reference_wav16k(clip: ReferenceClip) -> torch.Tensor:
    """The HuBERT input: ``librosa.load(path, sr=16000)`` of the clip, float32 (n16,)."""
    return torch.from_numpy(resample_soxr(clip.audio, clip.sample_rate, SSL_SAMPLE_RATE).copy())


@torch.no_grad()
def prompt_semantic(clip: ReferenceClip, ssl_model: torch.nn.Module, sovits: torch.nn.Module,
                    sovits_sample_rate: int = SPEC_SAMPLE_RATE) -> torch.Tensor:
    """Prompt semantic tokens (T,) int64: 16 kHz + 9600 zeros -> HuBERT -> ``sovits.extract_latent``."""
    feats = prompt_ssl_features(ssl_model, reference_wav16k(clip), sovits_sample_rate)  # (1, 768, T_h)
    return prompt_codes(feats, sovits)


def prompt_audio16k(clip: ReferenceClip, sovits_sample_rate: int = SPEC_SAMPLE_RATE) -> torch.Tensor:
    """HuBERT's input on the prompt path: the 16 kHz clip and the official trailing zeros (n16 + 9600,)."""
    return with_prompt_pad(reference_wav16k(clip), sovits_sample_rate)


@torch.no_grad()
def prompt_codes(ssl_features: torch.Tensor, sovits: torch.nn.Module) -> torch.Tensor:
    """HuBERT features (1, 768, T_h) of a prompt -> its semantic tokens (T_h // 2,) (``sovits.extract_latent``)."""
    param = next(sovits.parameters())
    codes = sovits.extract_latent(ssl_features.to(device=param.device, dtype=param.dtype))  # (1, 1, T_h // 2)
    return codes[0, 0]


def reference_audio_32k(clip: ReferenceClip, sovits_sample_rate: int = SPEC_SAMPLE_RATE) -> torch.Tensor:
    """The spectrogram path's audio: torchaudio-style resample to 32 kHz, then the peak limit (1, n32)."""
    audio = torch.from_numpy(clip.audio).unsqueeze(0)  # (1, n)
    return limit_peak(resample_sinc(audio, clip.sample_rate, sovits_sample_rate))


def reference_spectrogram(audio32k: torch.Tensor) -> torch.Tensor:
    """(1, n32) -> the SoVITS reference spectrogram (1, 1025, n32 // 640), float32."""
    return linear_spectrogram(audio32k, SPEC_N_FFT, SPEC_HOP, SPEC_WIN)


def _sv_fbank(audio32k: torch.Tensor, sovits_sample_rate: int) -> torch.Tensor:
    """The speaker model's input of one clip (1, n32): 32 -> 16 kHz, Kaldi fbank (frames, 80)."""
    return kaldi_fbank(resample_sinc(audio32k, sovits_sample_rate, SV_SAMPLE_RATE)[0])


@torch.no_grad()
def sv_embedding(audio32k: torch.Tensor, sv_model: torch.nn.Module, sovits_sample_rate: int = SPEC_SAMPLE_RATE) -> torch.Tensor:
    """v2Pro/v2ProPlus speaker embedding (1, 20480): 32 -> 16 kHz, Kaldi fbank, ERes2NetV2."""
    feats = _sv_fbank(audio32k, sovits_sample_rate).unsqueeze(0)  # (1, frames, 80)
    param = next(sv_model.parameters())
    return sv_model.embed_frames(feats.to(device=param.device, dtype=param.dtype))


@torch.no_grad()
def sv_embeddings(audios32k: Sequence[torch.Tensor], sv_model: torch.nn.Module,
                  sovits_sample_rate: int = SPEC_SAMPLE_RATE) -> list[torch.Tensor]:
    """:func:`sv_embedding` of several clips (each (1, n32)) in one right-padded batch, each (1, 20480) what the
    clip alone gives, up to rounding (``ERes2NetV2.embed_frames`` with each row's frames)."""
    if len(audios32k) == 1:
        return [sv_embedding(audios32k[0], sv_model, sovits_sample_rate)]
    feats = [_sv_fbank(a, sovits_sample_rate) for a in audios32k]
    frames = torch.tensor([f.shape[0] for f in feats])
    param = next(sv_model.parameters())
    batch = pad_sequence(feats, batch_first=True).to(device=param.device, dtype=param.dtype)
    emb = sv_model.embed_frames(batch, frames)
    return [emb[i : i + 1] for i in range(len(feats))]


def sv_embedding_groups(items: Sequence[tuple[torch.nn.Module, torch.Tensor]]) -> list[torch.Tensor]:
    """``(SV model, audio (1, n32))`` pairs -> their embeddings, one :func:`sv_embeddings` batch per model (32 kHz
    SoVITS rate)."""
    from engine.batching import per_model

    return per_model(lambda model, audios: sv_embeddings(audios, model))(items)


@dataclass(frozen=True)
class ReferenceFeatures:
    """Everything SoVITS v1/v2/v2Pro* needs from one reference clip."""

    spec: torch.Tensor  # (1, 1025, F) float32
    prompt_semantic: torch.Tensor | None = None  # (T,) int64; None when not requested (aux references)
    sv_embedding: torch.Tensor | None = None  # (1, 20480); v2Pro/v2ProPlus only


def reference_features(clip: ReferenceClip, sovits: torch.nn.Module, ssl_model: torch.nn.Module | None = None,
                       sv_model: torch.nn.Module | None = None, with_prompt: bool = True,
                       sovits_sample_rate: int = SPEC_SAMPLE_RATE,
                       embed_sv: Callable[[torch.Tensor], torch.Tensor] | None = None) -> ReferenceFeatures:
    """Spectrogram, and optionally prompt tokens (needs ``ssl_model``) and the SV embedding (``sv_model``).
    ``embed_sv``: how the 32 kHz audio (1, n32) becomes the SV embedding (default: :func:`sv_embedding` with
    ``sv_model``; a server passes its batch across requests)."""
    needs_sv = bool(getattr(getattr(sovits, "dims", None), "is_pro", False))
    if needs_sv and sv_model is None:
        raise EngineError("this v2Pro/v2ProPlus model needs the speaker-verification model (sv_model)")
    if with_prompt and ssl_model is None:
        raise EngineError("prompt tokens need the HuBERT model (ssl_model)")
    if embed_sv is None:
        def embed_sv(audio: torch.Tensor) -> torch.Tensor:
            return sv_embedding(audio, sv_model, sovits_sample_rate)

    audio32k = reference_audio_32k(clip, sovits_sample_rate)
    return ReferenceFeatures(
        spec=reference_spectrogram(audio32k),
        prompt_semantic=prompt_semantic(clip, ssl_model, sovits, sovits_sample_rate) if with_prompt else None,
        sv_embedding=embed_sv(audio32k) if needs_sv else None,
    )


@dataclass(frozen=True)
class Reference:
    """The voice to clone: a clip (path or the file's bytes), its transcript and language.

    An empty ``text`` means reference-free T2S (v1/v2/v2Pro* only). ``aux_audio`` are extra clips
    whose style vectors are averaged with the main one (v1/v2/v2Pro*; ignored by v3/v4).
    """

    audio: str | os.PathLike | bytes
    text: str = ""
    language: str = ""
    aux_audio: tuple[str | os.PathLike | bytes, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.audio, (str, os.PathLike, bytes)) or (isinstance(self.audio, str) and not self.audio):
            raise ReferenceAudioError("a reference clip is required (a path or the file's bytes)",
                                      field="reference.audio")
        if not isinstance(self.text, str):
            raise OptionsError(f"the transcript must be a string, got {type(self.text).__name__}",
                               field="reference.text")
        if self.text.strip() and not self.language:
            raise OptionsError("the transcript's language is required when a transcript is given",
                               field="reference.language")
        if isinstance(self.aux_audio, (str, bytes)):
            raise OptionsError("the auxiliary clips must be a list of clips, not a single one",
                               field="reference.aux_audio")


@dataclass(frozen=True)
class PreparedReference:
    """Everything a reference contributes to synthesis, on the model's device."""

    specs: tuple[torch.Tensor, ...]  # (1, 1025, F) per clip, main first
    sv: tuple[torch.Tensor, ...] | None  # (1, 20480) per clip (v2Pro*), else None
    prompt_semantic: torch.Tensor | None  # (T,) int64; None when reference-free
    prompt_phones: tuple[int, ...]  # phone ids of the transcript (empty when reference-free)
    prompt_bert: torch.Tensor | None  # (bert width, P) float32
    prompt_norm_text: str
    voice_prompt: object | None = None  # engine.acoustic.cfm.VoicePrompt (v3/v4)
