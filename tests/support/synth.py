"""Shared helpers of the pipeline / pool / CLI tests: tiny random model sets (one per version, made once
per test session), loaded studios, and synthetic reference clips (no shared files needed)."""

from __future__ import annotations

import atexit
import io
import shutil
import tempfile
import threading
from pathlib import Path

import numpy as np
import soundfile as sf

from engine.versions import DIRECT_VERSIONS, VOCODER_VERSIONS

VERSIONS = DIRECT_VERSIONS + VOCODER_VERSIONS  # the direct-audio versions first, then v3/v4
OUTPUT_RATE = {"v1": 32000, "v2": 32000, "v2Pro": 32000, "v2ProPlus": 32000, "v3": 24000, "v4": 48000}
REF_TEXT = "Yesterday I walked to the old library and borrowed three books."

_lock = threading.RLock()
_root: Path | None = None
_configs: dict[str, Path] = {}
_studios: dict[str, object] = {}


def _tmp_root() -> Path:
    global _root
    if _root is None:
        _root = Path(tempfile.mkdtemp(prefix="sovits-synth-tests-"))
        atexit.register(shutil.rmtree, _root, True)
    return _root


def model_config(version: str) -> Path:
    """The tts_infer.yaml of a tiny random ``version`` set (written on first use)."""
    from engine.testweights import make_test_weights

    with _lock:
        if version not in _configs:
            _configs[version] = make_test_weights(_tmp_root() / version, version)
        return _configs[version]


def studio(version: str):
    """A shared Studio over the tiny ``version`` set (CPU, fp32). Tests must not change its settings."""
    from engine.config import load_config
    from engine.loading.model_pool import WeightSet
    from engine.studio import Studio
    from engine.runtime import resolve_runtime

    config = model_config(version)
    with _lock:
        if version not in _studios:  # built directly: some tests patch Studio.from_config to return these
            _studios[version] = Studio(WeightSet.from_config(load_config(config)), resolve_runtime("cpu", "fp32"))
        return _studios[version]


def clip(seconds: float = 4.0, rate: int = 24000, pitch: float = 140.0, seed: int = 0) -> np.ndarray:
    """A speech-like synthetic clip: harmonics of ``pitch`` with syllable-rate amplitude bursts, plus noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    tone = sum(np.sin(2 * np.pi * pitch * k * t + rng.uniform(0, 6)) / k for k in range(1, 6))
    envelope = 0.5 * (1 + np.sin(2 * np.pi * 4.0 * t)) ** 2
    x = tone * envelope + 0.02 * rng.standard_normal(t.shape)
    return (0.5 * x / np.abs(x).max()).astype(np.float32)


def wav_bytes(audio: np.ndarray, rate: int = 24000) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, audio, rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def ref_file(folder: Path, name: str = "ref.wav", **kwargs) -> Path:
    path = Path(folder) / name
    rate = kwargs.pop("rate", 24000)
    sf.write(path, clip(rate=rate, **kwargs), rate, subtype="PCM_16")
    return path
