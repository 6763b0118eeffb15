"""Response encoders: each format decodes back to the samples that went in (exactly for PCM formats,
within a lossy codec's error for the others), and streams are framed as the official server frames them."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest
import soundfile as sf

from engine import audio_formats as af
from engine.errors import OptionsError

SR = 32000


def _tone(seconds: float = 0.5, sr: int = SR, seed: int = 0) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    rng = np.random.default_rng(seed)
    # a 200 Hz -> 2.2 kHz sweep: aperiodic, so cross-correlation finds a codec's delay unambiguously
    x = 0.5 * np.sin(2 * np.pi * (200 * t + 1000 * t**2)) + 0.01 * rng.standard_normal(t.size)
    return af.to_pcm16(x)


def _snr_db(ref: np.ndarray, got: np.ndarray) -> float:
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    return 10 * np.log10(np.sum(ref**2) / max(np.sum((ref - got) ** 2), 1e-9))


def test_float_to_int16_is_the_official_scaling_without_wrapping() -> None:
    x = np.array([0.0, 0.5, -0.5, -1.0, 1.0, 2.0, np.nan], dtype=np.float32)
    # TTS.py: (x * 32768).astype(int16); +1.0 would wrap to -32768 there, we clip to 32767
    assert af.to_pcm16(x).tolist() == [0, 16384, -16384, -32768, 32767, 32767, 0]
    pcm = np.array([1, -2, 3], dtype=np.int16)
    assert af.to_pcm16(pcm) is pcm
    with pytest.raises(OptionsError, match="mono"):
        af.to_pcm16(np.zeros((2, 10), dtype=np.float32))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_float_to_int16_equals_the_float64_formula_for_every_value(dtype) -> None:
    """The conversion computes in the input's float type; it equals clip(nan_to_num(x) * 32768) in float64 for
    every value: loud, quiet, +-1, NaN and the infinities."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(20_000) * 2).astype(dtype)
    x[:6] = [np.nan, np.inf, -np.inf, 1.0, -1.0, 0.99999]
    with np.errstate(over="ignore"):
        want = np.clip(np.nan_to_num(x.astype(np.float64)) * 32768.0, -32768, 32767).astype(np.int16)
    np.testing.assert_array_equal(af.to_pcm16(x), want)


@pytest.mark.parametrize("media_type", ["wav", "flac"])
def test_lossless_formats_round_trip_exactly(media_type: str) -> None:
    pcm = _tone()
    data, sr = sf.read(io.BytesIO(af.encode(pcm, SR, media_type)), dtype="int16")
    assert sr == SR and np.array_equal(data, pcm)


@pytest.mark.parametrize("media_type", ["raw", "pcm"])
def test_raw_is_little_endian_int16(media_type: str) -> None:
    pcm = _tone()
    assert af.encode(pcm, SR, media_type) == pcm.astype("<i2").tobytes()


@pytest.mark.parametrize("media_type", ["ogg", "mp3"])
def test_lossy_soundfile_formats_decode_to_the_same_signal(media_type: str) -> None:
    pcm = _tone()
    data, sr = sf.read(io.BytesIO(af.encode(pcm, SR, media_type)), dtype="int16")
    assert sr == SR
    if media_type == "mp3":  # MP3 decoders prepend the encoder delay; align by cross-correlation
        lag = int(np.argmax(np.correlate(data[:4000].astype(float), pcm[:2000].astype(float), "valid")))
        data = data[lag:]
    n = min(len(pcm), len(data))
    assert abs(len(data) - len(pcm)) < 2000
    # a sweep through a perceptual codec at default quality: > 15 dB SNR (≈ 3% error energy)
    assert _snr_db(pcm[:n], data[:n]) > 15


def test_opus_is_resampled_to_an_opus_rate() -> None:
    data, sr = sf.read(io.BytesIO(af.encode(_tone(), SR, "opus")), dtype="int16")
    assert sr == 48000 and abs(len(data) - int(0.5 * 48000)) < 2000


def test_aac_is_adts_at_the_input_rate() -> None:
    av = pytest.importorskip("av")
    pcm = _tone(1.0)
    data = af.encode(pcm, SR, "aac")
    assert data[:2] == b"\xff\xf1"  # ADTS sync word, MPEG-4, no CRC
    with av.open(io.BytesIO(data), format="adts") as c:
        frames = [f.to_ndarray().reshape(-1) for f in c.decode(audio=0)]
        rate = c.streams.audio[0].sample_rate
    out = np.concatenate(frames)
    assert rate == SR
    assert len(pcm) <= len(out) <= len(pcm) + 3 * 1024  # AAC adds priming/padding frames of 1024 samples
    lag = int(np.argmax(np.correlate(out[:8000], pcm[:4000].astype(np.float32) / 32768, "valid")))
    assert lag <= 2048  # the encoder delay
    seg = out[lag:lag + len(pcm)] * 32768
    assert _snr_db(pcm[:len(seg)], seg) > 15  # 192 kbit/s AAC-LC


def test_unknown_media_type_names_the_field() -> None:
    with pytest.raises(OptionsError, match="media_type: 'mp4' is not supported"):
        af.encode(_tone(), SR, "mp4")
    with pytest.raises(OptionsError, match="media_type"):
        af.content_type("flv")
    assert af.content_type("wav") == "audio/wav" and af.content_type("mp3") == "audio/mpeg"


def test_wav_stream_is_one_header_then_raw_pcm() -> None:
    chunks = [(SR, _tone(0.1, seed=i)) for i in range(3)]
    parts = list(af.encode_stream(iter(chunks), "wav"))
    assert len(parts) == 4
    with wave.open(io.BytesIO(parts[0])) as w:  # the official header: mono, 16-bit, 0 frames
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (1, 2, SR, 0)
    assert b"".join(parts[1:]) == np.concatenate([c for _, c in chunks]).astype("<i2").tobytes()


def test_ogg_stream_chunks_are_each_decodable() -> None:
    chunks = [(SR, _tone(0.2, seed=i)) for i in range(2)]
    for (_, pcm), part in zip(chunks, af.encode_stream(iter(chunks), "ogg")):
        data, sr = sf.read(io.BytesIO(part), dtype="int16")
        assert sr == SR and abs(len(data) - len(pcm)) < 1000


def test_long_ogg_is_written_in_blocks() -> None:
    # the official server needed a 16 MiB thread stack for ~500k frames (upstream #1199); block writes avoid it
    pcm = np.zeros(600_000, dtype=np.int16)
    data, sr = sf.read(io.BytesIO(af.encode(pcm, SR, "ogg")), dtype="int16")
    assert len(data) == len(pcm)
