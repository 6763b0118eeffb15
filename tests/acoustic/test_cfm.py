"""Chunking, SOLA, noise injection and windowed vocoding of the v3/v4 synthesis path."""

from __future__ import annotations

import pytest
import torch

from tests.support.paths import conformance_root


def test_replay_noise_checks_shape_and_count():
    from engine.acoustic.cfm import replay_noise

    a, b = torch.randn(1, 100, 5), torch.randn(2, 100, 7)
    draw = replay_noise([a, b])
    assert torch.equal(draw((1, 100, 5), torch.float32, torch.device("cpu")), a)
    with pytest.raises(ValueError, match="recorded noise \\(2, 100, 7\\) but the CFM asks for \\(1, 100, 7\\)"):
        draw((1, 100, 7), torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match="more CFM calls"):
        draw((1, 100, 5), torch.float32, torch.device("cpu"))


def test_cfm_sampler_uses_the_injected_noise_and_keeps_the_prompt_zero():
    from engine.models.cfm import CFM
    from engine.models.dit import DiT, DiTDims

    torch.manual_seed(0)
    cfm = CFM(DiT(DiTDims(dim=32, depth=1, heads=2, dim_head=16, text_dim=24, conv_layers=1)).eval())
    feats, prompt = torch.randn(1, 24, 20), torch.randn(1, 100, 6)
    noise = torch.randn(1, 100, 20)
    a = cfm.sample(feats, prompt, 3, noise=noise)
    b = cfm.sample(feats, prompt, 3, noise=lambda shape, dtype, device: noise.clone())
    assert torch.equal(a, b) and torch.all(a[..., :6] == 0)
    assert not torch.equal(a, cfm.sample(feats, prompt, 3, noise=torch.randn(1, 100, 20)))
    with pytest.raises(ValueError, match="expected \\(1, 100, 20\\)"):
        cfm.sample(feats, prompt, 3, noise=torch.randn(1, 100, 19))
    with pytest.raises(ValueError, match="steps"):
        cfm.sample(feats, prompt, 0, noise=noise)


@pytest.mark.parametrize("length,chunk,overlap", [(100, 30, 12), (18, 30, 12), (653, 653, 12), (1306, 653, 12)])
def test_batched_windows_cover_the_features(length, chunk, overlap):
    from engine.acoustic.cfm import batched_windows

    feats = torch.arange(1, length + 1, dtype=torch.float32).view(1, 1, -1)
    windows, padding = batched_windows(feats, chunk, overlap)
    assert windows.shape[1:] == (1, chunk)
    # first window: `overlap` zero frames then the start; each next window repeats the previous `overlap` frames
    flat = torch.cat([windows[0, 0]] + [w[0, overlap:] for w in windows[1:]])
    body = flat[overlap : overlap + length]
    assert torch.equal(body, feats[0, 0]) and torch.all(flat[:overlap] == 0)
    assert torch.all(flat[overlap + length :] == 0) and flat.shape[0] - overlap - length == padding
    for prev, nxt in zip(windows[:-1], windows[1:]):
        assert torch.equal(prev[0, -overlap:], nxt[0, :overlap])


def test_sola_join_restores_a_continuous_signal_and_finds_shifts():
    from engine.acoustic.cfm import sola_join

    t = torch.arange(4000, dtype=torch.float32)
    signal = torch.sin(t * 0.05) * torch.cos(t * 0.013)
    ov = 200
    pieces = [signal[0:1200], signal[1000:2600], signal[2400:4000]]  # consecutive pieces overlap by ov
    joined = sola_join(pieces, ov, search=50)
    assert joined.shape[0] == 4000  # each join drops ov samples of the left piece
    assert torch.allclose(joined, signal, atol=1e-5)
    # a right piece that starts 17 samples early is re-aligned by the correlation search
    shifted = [signal[0:1200], signal[1000 - 17 : 2600]]
    out = sola_join(shifted, ov, search=50)
    assert torch.allclose(out[1000:1300], signal[1000:1300], atol=1e-4)


def test_vocoding_in_windows_matches_one_call():
    """Mels longer than a Core ML package's bound are cut with 48 frames of context: float-noise level.

    (Measured the same way on the fixture BigVGAN: 3.9e-6 of full scale with 48 frames of context.)
    """
    from engine.coreml.package import vocode_in_windows
    from engine.loading.vocoder import load_v4_vocoder

    path = conformance_root() / "v3v4" / "v4_vocoder_small.pth"
    if not path.is_file():
        pytest.skip("no v3v4 fixtures")
    net = load_v4_vocoder(path)
    gen = torch.Generator().manual_seed(0)
    mel = torch.randn(1, 100, 150, generator=gen) * 1.5 - 5
    with torch.inference_mode():
        whole = net(mel)
        windowed = vocode_in_windows(net, mel, max_frames=128, hop=480)
    assert windowed.shape == whole.shape
    assert float((windowed - whole).abs().max() / whole.abs().max()) < 1e-4
    with pytest.raises(ValueError, match="no room"):
        vocode_in_windows(net, mel, max_frames=90, hop=480)


def test_windowing_is_exact_for_a_finite_receptive_field():
    from engine.coreml.package import vocode_in_windows

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv1d(8, 8, 9, padding=4), torch.nn.Tanh(), torch.nn.Conv1d(8, 1, 9, padding=4),
                              torch.nn.Upsample(scale_factor=3))  # receptive field 8 frames per side
    mel = torch.randn(1, 8, 333)
    with torch.no_grad():
        assert torch.allclose(vocode_in_windows(net, mel, max_frames=64, hop=3, context=16), net(mel), atol=1e-6)


def test_windows_respect_the_minimum_length():
    from engine.coreml.package import vocode_in_windows

    seen = []

    def fake(mel):
        seen.append(mel.shape[-1])
        return mel[:, :1].repeat_interleave(2, dim=-1)

    mel = torch.arange(205, dtype=torch.float32).view(1, 1, -1).repeat(1, 3, 1)
    out = vocode_in_windows(fake, mel, max_frames=100, hop=2, context=10, min_frames=40)
    assert torch.equal(out, mel[:, :1].repeat_interleave(2, dim=-1))
    assert min(seen) >= 40 and max(seen) <= 100
