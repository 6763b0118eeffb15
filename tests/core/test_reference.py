"""engine.reference: the 3-10 s rule as a typed error, opt-in trim/pad, silence/clipping checks,
and clip -> features with test weights in the official formats."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from engine.errors import EngineError, OptionsError, ReferenceAudioError
from engine.reference import (
    ClippedReferenceError,
    NearEmptyReferenceError,
    ReferenceLengthError,
    ReferenceRules,
    SilentReferenceError,
    check_reference,
    read_reference,
    reference_features,
    reference_wav16k,
)
from tests.support.audio import write_hour_long_wav

SR = 32000


def _speechlike(seconds: float, sr: int = SR, seed: int = 0) -> np.ndarray:
    """A harmonic tone with a syllable-rate envelope plus a little noise (never clipped, never silent)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(round(seconds * sr))) / sr
    env = 0.55 + 0.45 * np.sin(2 * np.pi * 3.0 * t)
    x = env * (0.3 * np.sin(2 * np.pi * 180 * t) + 0.15 * np.sin(2 * np.pi * 720 * t))
    return (x + 0.01 * rng.standard_normal(t.shape)).astype(np.float32)


def _write(path: Path, x: np.ndarray, sr: int = SR) -> Path:
    sf.write(path, x, sr, subtype="PCM_16")
    return path


# ---- length rule -----------------------------------------------------------------------------


@pytest.mark.parametrize("seconds", [2.2, 10.5])
def test_outside_3_to_10_s_is_a_typed_error_with_the_measured_length(tmp_path: Path, seconds: float) -> None:
    path = _write(tmp_path / "ref.wav", _speechlike(seconds))
    with pytest.raises(ReferenceLengthError) as info:
        read_reference(path)
    e = info.value
    assert isinstance(e, ReferenceAudioError)
    assert e.seconds == pytest.approx(seconds, abs=1e-3) and (e.min_seconds, e.max_seconds) == (3.0, 10.0)
    assert f"{seconds:.2f} s" in str(e) and "3-10 s" in str(e) and "trim_pad" in str(e)


def test_official_bounds_are_inclusive_in_16k_samples(tmp_path: Path) -> None:
    for seconds in (3.0, 10.0):  # 48000 and 160000 samples at 16 kHz are allowed
        clip = read_reference(_write(tmp_path / f"{seconds}.wav", _speechlike(seconds)))
        assert clip.seconds == seconds and clip.adjustment == ""
    with pytest.raises(ReferenceLengthError):  # one 16 kHz sample too many
        check_reference(_speechlike(10.0 + 2 / SR), SR)


def test_trim_pad_opt_in(tmp_path: Path) -> None:
    rules = ReferenceRules(fit="trim_pad")
    long = read_reference(_write(tmp_path / "long.wav", _speechlike(12.3)), rules)
    assert long.adjustment == "trimmed" and long.seconds == 10.0 and long.original_seconds == pytest.approx(12.3)
    short = read_reference(_write(tmp_path / "short.wav", _speechlike(2.2)), rules)
    assert short.adjustment == "padded" and short.seconds == 3.0
    assert np.all(short.audio[int(2.2 * SR) :] == 0)
    assert reference_wav16k(short).numel() == 48000 and reference_wav16k(long).numel() == 160000


def test_hour_long_reference_is_refused_with_bounded_memory(tmp_path: Path) -> None:
    import tracemalloc

    path = tmp_path / "hour.wav"
    write_hour_long_wav(path)
    tracemalloc.start()
    try:
        with pytest.raises(ReferenceLengthError, match="3600.00 s"):
            read_reference(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 5_000_000


def test_rules_are_validated() -> None:
    with pytest.raises(OptionsError):
        ReferenceRules(fit="stretch")
    with pytest.raises(OptionsError):
        ReferenceRules(min_seconds=5, max_seconds=4)


# ---- content checks --------------------------------------------------------------------------


def test_silent_clip() -> None:
    with pytest.raises(SilentReferenceError, match="silent"):
        check_reference(np.zeros(4 * SR, dtype=np.float32), SR)
    quiet = (1e-4 * np.random.default_rng(0).standard_normal(4 * SR)).astype(np.float32)  # -80 dBFS hiss
    with pytest.raises(SilentReferenceError):
        check_reference(quiet, SR)


def test_near_empty_clip() -> None:
    x = np.zeros(5 * SR, dtype=np.float32)
    x[SR : SR + SR // 10] = _speechlike(0.1) * 2  # 0.1 s of sound in 5 s
    with pytest.raises(NearEmptyReferenceError, match="0.10 s"):
        check_reference(x, SR)


def test_clipped_clip() -> None:
    x = np.clip(_speechlike(4.0) * 6, -1.0, 1.0)
    with pytest.raises(ClippedReferenceError, match="clipped"):
        check_reference(x, SR)
    check_reference(np.clip(_speechlike(4.0) * 6, -1.0, 1.0), SR, ReferenceRules(max_clipped_fraction=1.0))


def test_nan_and_empty_arrays() -> None:
    x = _speechlike(4.0)
    x[5] = np.nan
    with pytest.raises(ReferenceAudioError, match="NaN"):
        check_reference(x, SR)
    with pytest.raises(ReferenceAudioError, match="zero length"):
        check_reference(np.zeros(0, dtype=np.float32), SR)


@pytest.mark.parametrize("case", ["spikes", "alternating", "negative"])
def test_samples_far_outside_full_scale_are_refused_by_name(tmp_path: Path, case: str) -> None:
    x = _speechlike(4.0)
    if case == "spikes":  # a few 1e30 samples: on 2f66d90 read, then an inf spectrogram
        x[::1000] = 1e30
    elif case == "alternating":  # on 2f66d90 "clipped ... at the peak level 1000000015047466219876688855040.000"
        x[::2], x[1::2] = 1e30, -1e30
    else:
        x[SR] = -1e30
    path = tmp_path / "absurd.wav"
    sf.write(path, x, SR, subtype="FLOAT")
    with pytest.raises(ReferenceAudioError, match=r"samples of 1e\+30; audio samples lie within \[-1, 1\]") as e:
        read_reference(path)
    assert not isinstance(e.value, ClippedReferenceError)
    check_reference(np.clip(_speechlike(4.0) * 1.8, -1.8, 1.8), SR, ReferenceRules(max_clipped_fraction=1.0))


@pytest.mark.parametrize("offset, hiss", [(0.5, 0.0), (-0.25, 0.0), (0.5, 1e-5)])
def test_a_constant_level_is_silence_whatever_its_offset(tmp_path: Path, offset: float, hiss: float) -> None:
    x = (offset + hiss * np.random.default_rng(0).standard_normal(4 * SR)).astype(np.float32)
    path = tmp_path / "dc.wav"
    sf.write(path, x, SR, subtype="FLOAT")
    with pytest.raises(SilentReferenceError, match="constant level") as e:  # 2f66d90 read it as a reference
        read_reference(path)
    assert f"{offset:.3f}" in str(e.value)
    check_reference(_speechlike(4.0) * 0.5 + 0.3, SR)  # speech over an offset is still speech


def test_stereo_is_mixed_down(tmp_path: Path) -> None:
    left, right = _speechlike(4.0, seed=1), _speechlike(4.0, seed=2) * 0.5
    path = tmp_path / "stereo.wav"
    sf.write(path, np.stack([left, right], axis=1), SR, subtype="FLOAT")
    clip = read_reference(path)
    np.testing.assert_allclose(clip.audio, (left + right) / 2, atol=1e-7)


# ---- features with test weights -------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from engine.acoustic.hubert import load_hubert
    from engine.loading.sovits import load_sovits
    from engine.loading.sv import load_sv_model
    from engine.testweights.sovits import write_hubert_folder, write_sovits, write_sv_checkpoint

    d = tmp_path_factory.mktemp("weights")
    return {
        "hubert": load_hubert(write_hubert_folder(d / "hubert")),
        "sv": load_sv_model(write_sv_checkpoint(d / "sv.ckpt")),
        "v2": load_sovits(write_sovits(d / "v2.pth", "v2")),
        "v2Pro": load_sovits(write_sovits(d / "v2Pro.pth", "v2Pro")),
    }


def test_features_v2(models, tmp_path: Path) -> None:
    clip = read_reference(_write(tmp_path / "ref.wav", _speechlike(3.5)))
    feats = reference_features(clip, models["v2"].module, models["hubert"])
    n16 = 56000 + 9600
    assert feats.prompt_semantic.dtype == torch.int64
    assert feats.prompt_semantic.shape == (((n16 - 400) // 320 + 1) // 2,)
    assert feats.spec.shape == (1, 1025, int(3.5 * SR) // 640) and feats.sv_embedding is None
    with torch.no_grad():
        audio = models["v2"].module.decode(feats.prompt_semantic[None, None, :12], torch.tensor([[5, 9, 13]]), [feats.spec])
    assert audio.shape == (1, 1, 12 * 1280) and torch.isfinite(audio).all()
    with pytest.raises(EngineError, match="HuBERT"):
        reference_features(clip, models["v2"].module, None)
    aux = reference_features(clip, models["v2"].module, with_prompt=False)
    assert aux.prompt_semantic is None and torch.equal(aux.spec, feats.spec)


@pytest.mark.parametrize("hubert", ["test weights", "conformance"])
def test_hubert_features_of_clips_batched_together_are_each_clips_alone(models, hubert, shared_dir: Path) -> None:
    """Clips of different lengths in one padded HuBERT batch: each gets its features alone, up to rounding.
    The first feature-encoder layer's GroupNorm normalises over time: over the padding too, a short clip's
    features were off by up to 0.9 (on the conformance model); its statistics are taken per clip."""
    from engine.acoustic.hubert import load_hubert, prompt_ssl_features, ssl_features_batch, ssl_features_groups

    tiny = shared_dir / "conformance" / "hubert" / "tiny-chinese-hubert-base"
    model = models["hubert"] if hubert == "test weights" else load_hubert(tiny)
    g = torch.Generator().manual_seed(0)
    wavs = [0.1 * torch.randn(n, generator=g) for n in (48000, 70001, 55555)]
    alone = [prompt_ssl_features(model, w) for w in wavs]
    padded = [torch.cat([w, torch.zeros(9600)]) for w in wavs]
    for got in (ssl_features_batch(model, padded), ssl_features_groups([(model, w) for w in padded])):
        for a, b in zip(alone, got):
            assert a.shape == b.shape
            torch.testing.assert_close(b, a, rtol=1e-5, atol=2e-5)


def test_speaker_embeddings_of_clips_batched_together_are_each_clips_alone(models) -> None:
    """Clips of different lengths in one padded speaker-model batch: every 3x3 convolution sees zeros past a
    clip's end and the time average covers its own frames, so each gets its embedding alone (unmasked, the
    padding moved a short clip's embedding by up to 0.19)."""
    from engine.reference import sv_embedding, sv_embedding_groups, sv_embeddings

    g = torch.Generator().manual_seed(0)
    audios = [0.1 * torch.randn(1, n, generator=g) for n in (96000, 150001, 123457, 320000)]
    alone = [sv_embedding(a, models["sv"]) for a in audios]
    for got in (sv_embeddings(audios, models["sv"]), sv_embedding_groups([(models["sv"], a) for a in audios])):
        for a, b in zip(alone, got):
            assert a.shape == b.shape
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_features_v2pro_include_the_sv_embedding(models, tmp_path: Path) -> None:
    clip = read_reference(_write(tmp_path / "ref.wav", _speechlike(4.0)))
    pro = models["v2Pro"].module
    with pytest.raises(EngineError, match="speaker-verification"):
        reference_features(clip, pro, models["hubert"])
    feats = reference_features(clip, pro, models["hubert"], models["sv"])
    assert feats.sv_embedding.shape == (1, pro.dims.sv_dim)
    with torch.no_grad():
        audio = pro.decode(feats.prompt_semantic[None, None, :10], torch.tensor([[5, 9]]), [feats.spec, feats.spec],
                           sv_emb=[feats.sv_embedding, feats.sv_embedding])
    assert audio.shape == (1, 1, 10 * 1280) and torch.isfinite(audio).all()


def test_real_clips_follow_the_official_library_paths(shared_dir: Path) -> None:
    """Refset clips at 22.05/24/48 kHz: the HuBERT input equals ``librosa.load(sr=16000)`` and the
    spectrogram input equals TTS.py's torchaudio Resample + peak rule, sample for sample."""
    librosa = pytest.importorskip("librosa")
    import torchaudio

    from engine.reference import reference_audio_32k

    clips = sorted((shared_dir / "refset").glob("*.wav"))[:3]
    if not clips:
        pytest.skip("no refset clips")
    for path in clips:
        clip = read_reference(path)
        want16, _ = librosa.load(path, sr=16000)
        np.testing.assert_array_equal(reference_wav16k(clip).numpy(), want16)
        data, sr = sf.read(path, dtype="float32", always_2d=True)
        raw = torch.from_numpy(data.T).mean(0, keepdim=True)
        want32 = torchaudio.transforms.Resample(sr, 32000)(raw) if sr != 32000 else raw
        peak = want32.abs().max()
        want32 = want32 / min(2, peak) if peak > 1 else want32
        assert torch.equal(reference_audio_32k(clip), want32), path.name
