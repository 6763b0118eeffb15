"""engine.audio: decoding formats, mono mix-down, resampling, the linear spectrogram, bad files."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from engine.audio import (
    MIN_SAMPLE_RATE,
    limit_peak,
    linear_spectrogram,
    read_audio,
    resample_soxr,
    resampled_length,
    to_mono,
)
from engine.errors import ReferenceAudioError
from tests.support.audio import write_hour_long_wav


def _tone(sr: int, seconds: float, channels: int = 1) -> np.ndarray:
    t = np.arange(int(sr * seconds)) / sr
    base = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.1 * np.sin(2 * np.pi * 1330 * t)
    return np.stack([base * (1 - 0.2 * c) for c in range(channels)], axis=1).astype(np.float32)


@pytest.mark.parametrize("fmt,subtype,exact", [("WAV", "PCM_16", True), ("FLAC", "PCM_16", True),
                                               ("OGG", "VORBIS", False), ("MP3", "MPEG_LAYER_III", False)])
def test_reads_common_formats(tmp_path: Path, fmt: str, subtype: str, exact: bool) -> None:
    if fmt not in sf.available_formats():
        pytest.skip(f"libsndfile here cannot write {fmt}")
    data = _tone(32000, 1.0, channels=2)
    pcm = np.round(data * 32767).astype(np.int16)
    path = tmp_path / f"clip.{fmt.lower()}"
    sf.write(path, pcm if exact else data, 32000, format=fmt, subtype=subtype)
    audio = read_audio(path)
    assert audio.sample_rate == 32000 and audio.samples.shape[0] == 2 and audio.samples.dtype == np.float32
    if exact:  # PCM16 decodes to int16 / 32768, what torchaudio.load returns
        np.testing.assert_array_equal(audio.samples, pcm.T.astype(np.float32) / 32768)
    else:  # lossy codecs: same length (up to codec padding) and clearly the same signal
        n = min(audio.num_frames, data.shape[0])
        assert abs(audio.num_frames - data.shape[0]) < 3000
        lag = int(np.argmax(np.correlate(audio.samples[0, :4000], data[:4000, 0], "full"))) - 3999
        a = audio.samples[0, max(lag, 0) : n]
        b = data[: len(a), 0]
        assert np.corrcoef(a, b)[0, 1] > 0.9


def test_mono_is_the_channel_mean() -> None:
    x = np.array([[1.0, 0.0, -1.0], [0.0, 1.0, 1.0]], dtype=np.float32)
    np.testing.assert_array_equal(to_mono(x), [0.5, 0.5, 0.0])
    np.testing.assert_array_equal(to_mono(x[:1]), x[0])
    assert to_mono(x).dtype == np.float32


@pytest.mark.parametrize("sr_in,sr_out", [(32000, 16000), (44100, 16000), (22050, 16000), (16000, 16000)])
def test_soxr_resampling_matches_librosa_load(sr_in: int, sr_out: int) -> None:
    librosa = pytest.importorskip("librosa")
    x = _tone(sr_in, 1.37)[:, 0]
    got = resample_soxr(x, sr_in, sr_out)
    assert got.shape[0] == resampled_length(x.shape[0], sr_in, sr_out)
    want = librosa.resample(x, orig_sr=sr_in, target_sr=sr_out, res_type="soxr_hq") if sr_in != sr_out else x
    np.testing.assert_array_equal(got, want)


def _reference_spectrogram(x: np.ndarray, n_fft: int = 2048, hop: int = 640) -> np.ndarray:
    """Independent float64 numpy version of spectrogram_torch(center=False), for the equivalence test."""
    pad = (n_fft - hop) // 2
    y = np.pad(x.astype(np.float64), (pad, pad), mode="reflect")
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)  # periodic Hann
    frames = 1 + (len(y) - n_fft) // hop
    spec = np.stack([np.fft.rfft(y[i * hop : i * hop + n_fft] * window) for i in range(frames)], axis=1)
    return np.sqrt(spec.real**2 + spec.imag**2 + 1e-8)


def test_linear_spectrogram_equals_independent_numpy_version() -> None:
    x = np.random.default_rng(0).standard_normal(32000 * 2 + 123).astype(np.float32) * 0.3
    got = linear_spectrogram(torch.from_numpy(x)[None])
    assert got.shape == (1, 1025, x.shape[0] // 640) and got.dtype == torch.float32
    want = _reference_spectrogram(x)
    # float32 STFT of 2048 points vs float64: a few 1e-5 on bins of size ~10 (cf. the fixture floor)
    np.testing.assert_allclose(got[0].numpy(), want, rtol=1e-4, atol=1e-4)


def test_peak_limit_follows_tts_py() -> None:
    x = torch.tensor([[0.5, -0.9]])
    assert torch.equal(limit_peak(x), x)
    assert torch.allclose(limit_peak(torch.tensor([[1.5, -0.3]])), torch.tensor([[1.0, -0.2]]))
    assert torch.allclose(limit_peak(torch.tensor([[4.0, -1.0]])), torch.tensor([[2.0, -0.5]]))  # divides by 2 at most


# ---- bad input -------------------------------------------------------------------------------


def test_missing_folder_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(ReferenceAudioError, match="not found"):
        read_audio(tmp_path / "missing.wav")
    with pytest.raises(ReferenceAudioError, match="folder"):
        read_audio(tmp_path)
    (tmp_path / "empty.wav").write_bytes(b"")
    with pytest.raises(ReferenceAudioError, match="empty"):
        read_audio(tmp_path / "empty.wav")


def test_unreadable_bytes(tmp_path: Path) -> None:
    bad = tmp_path / "noise.wav"
    bad.write_bytes(np.random.default_rng(1).integers(0, 255, 5000, dtype=np.uint8).tobytes())
    with pytest.raises(ReferenceAudioError, match="cannot read audio"):
        read_audio(bad)


def test_zero_length_wav(tmp_path: Path) -> None:
    path = tmp_path / "zero.wav"
    sf.write(path, np.zeros((0, 1), dtype=np.float32), 32000, subtype="PCM_16")
    with pytest.raises(ReferenceAudioError, match="zero length"):
        read_audio(path)


def test_nan_filled_wav(tmp_path: Path) -> None:
    path = tmp_path / "nan.wav"
    data = _tone(32000, 1.0)
    data[100:200] = np.nan
    sf.write(path, data, 32000, subtype="FLOAT")
    with pytest.raises(ReferenceAudioError, match="NaN"):
        read_audio(path)


@pytest.mark.parametrize("sr", [4000, 1])
def test_wrong_sample_rate(tmp_path: Path, sr: int) -> None:
    path = tmp_path / "lowrate.wav"
    sf.write(path, np.zeros((max(sr, 10), 1), dtype=np.float32) + 0.1, sr, subtype="PCM_16")
    with pytest.raises(ReferenceAudioError, match=f"{sr} Hz.*{MIN_SAMPLE_RATE}"):
        read_audio(path)


def test_hour_long_file_is_refused_without_decoding_it(tmp_path: Path) -> None:
    path = tmp_path / "hour.wav"
    write_hour_long_wav(path)
    tracemalloc.start()
    try:
        with pytest.raises(ReferenceAudioError, match="3600.0 s long"):
            read_audio(path)
        audio = read_audio(path, max_seconds=5, truncate=True)  # only the start is decoded
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert audio.num_frames == 5 * 8000 and audio.total_frames == 3600 * 8000
    assert peak < 5_000_000, f"decoding used {peak} bytes"


def test_reads_file_objects(tmp_path: Path) -> None:
    import io

    buf = io.BytesIO()
    sf.write(buf, _tone(16000, 0.5), 16000, format="WAV", subtype="PCM_16")
    buf.seek(0)
    audio = read_audio(buf)
    assert audio.sample_rate == 16000 and audio.num_frames == 8000
    with pytest.raises(ReferenceAudioError, match="uploaded audio"):
        read_audio(io.BytesIO(b"garbage" * 10))


def test_postprocess_divides_by_the_peak_above_one_as_the_official_code_does():
    """engine.audio.postprocess against the official ``audio_postprocess`` written in torch: the same float32
    numbers for a peak above 1 (positive or negative), at or below 1 (unchanged), half precision and empty."""
    from engine.audio import postprocess

    def official(audio: torch.Tensor) -> np.ndarray:
        x = audio.float()
        peak = x.abs().max()
        return (x / peak if peak > 1 else x).numpy()

    g = torch.Generator().manual_seed(4)
    cases = [torch.randn(5000, generator=g) * 3, torch.randn(5000, generator=g) * 0.2,
             torch.tensor([0.5, -2.5, 1.0]), torch.tensor([1.0, -1.0]), (torch.randn(800, generator=g) * 4).half()]
    for audio in cases:
        got = postprocess(audio)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, official(audio))
    assert postprocess(torch.zeros(0)).shape == (0,)
