"""v3/v4 mel front end: our Slaney filterbank against librosa's, normalisation, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch


@pytest.mark.parametrize("sr,n_fft", [(24000, 1024), (32000, 1280)])
def test_filterbank_equals_librosa(sr, n_fft):
    librosa = pytest.importorskip("librosa")
    from engine.acoustic.mel import slaney_mel_filterbank

    ours = slaney_mel_filterbank(sr, n_fft, 100)
    ref = librosa.filters.mel(sr=sr, n_fft=n_fft, n_mels=100, fmin=0, fmax=None)
    assert ours.dtype == np.float32 and ours.shape == (100, n_fft // 2 + 1)
    assert np.array_equal(ours, ref)


def test_norm_denorm_roundtrip_and_range():
    from engine.acoustic.mel import denorm_spec, norm_spec

    x = torch.linspace(-12, 2, 15)
    assert torch.allclose(norm_spec(x)[[0, -1]], torch.tensor([-1.0, 1.0]))
    assert torch.allclose(denorm_spec(norm_spec(x)), x, atol=1e-6)


def test_reference_mel_shapes_and_stereo():
    from engine.acoustic.mel import reference_mel

    mono = torch.randn(1, 32000) * 0.1
    v3 = reference_mel(mono, 32000, "v3")  # resampled to 24 kHz, hop 256
    v4 = reference_mel(mono, 32000, "v4")  # kept at 32 kHz, hop 320
    assert v3.shape == (1, 100, 24000 // 256) and v4.shape == (1, 100, 32000 // 320)
    stereo = torch.stack([mono[0], mono[0]])
    assert torch.allclose(reference_mel(stereo, 32000, "v4"), v4)
    with pytest.raises(ValueError, match="'v3' or 'v4'"):
        reference_mel(mono, 32000, "v2")
    with pytest.raises(ValueError, match="too short"):
        reference_mel(torch.zeros(1, 100), 32000, "v4")
