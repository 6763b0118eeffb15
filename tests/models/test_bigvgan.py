"""BigVGAN and v4-vocoder loading: filters, weight-norm folding, file formats and bad input."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from engine.errors import CheckpointError
from tests.support.paths import conformance_root


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from engine.testweights.v3v4 import write_bigvgan_folder

    return write_bigvgan_folder(tmp_path_factory.mktemp("bigvgan") / "bv")


def test_kaiser_filters_equal_the_official_buffers():
    """The anti-aliasing filters we build equal the ones stored in an official-format checkpoint."""
    from engine.models.bigvgan import kaiser_sinc_filter

    path = conformance_root() / "v3v4" / "bigvgan_small" / "bigvgan_generator.pt"
    if not path.is_file():
        pytest.skip("no v3v4 fixtures")
    sd = torch.load(path, weights_only=True)["generator"]
    up = kaiser_sinc_filter(0.25, 0.3, 12)
    assert torch.equal(sd["activation_post.upsample.filter"], up)
    assert torch.equal(sd["activation_post.downsample.lowpass.filter"], up)
    assert abs(float(up.sum()) - 1.0) < 1e-6


def test_written_folder_is_official_layout(folder):
    sd = torch.load(folder / "bigvgan_generator.pt", weights_only=True)["generator"]
    assert "conv_pre.weight_g" in sd and "conv_pre.weight_v" in sd and "conv_pre.weight" not in sd
    assert "conv_post.bias" not in sd  # use_bias_at_final false
    assert all(v.dtype == torch.float32 for v in sd.values())
    h = json.loads((folder / "config.json").read_text())
    assert h["activation"] == "snakebeta" and h["snake_logscale"] is True


def test_weight_norm_is_folded_like_remove_weight_norm(folder, tmp_path):
    """A folder saved without weight norm (the from_pretrained fallback) gives the same model."""
    from engine.loading.vocoder import fold_weight_norm_pairs, load_bigvgan

    a = load_bigvgan(folder)
    folded = tmp_path / "folded"
    shutil.copytree(folder, folded)
    sd = torch.load(folder / "bigvgan_generator.pt", weights_only=True)["generator"]
    torch.save({"generator": fold_weight_norm_pairs(sd)}, folded / "bigvgan_generator.pt")
    b = load_bigvgan(folded)
    mel = torch.randn(1, 100, 10) - 4
    with torch.inference_mode():
        assert torch.equal(a(mel), b(mel))
    # g * v / ||v|| with the norm over every axis but 0
    g, v = sd["conv_pre.weight_g"], sd["conv_pre.weight_v"]
    expect = g * v / v.norm(dim=(1, 2), keepdim=True)
    assert torch.allclose(a.conv_pre.weight, expect, rtol=1e-6, atol=1e-7)


def test_missing_folder_config_and_weights(folder, tmp_path):
    from engine.loading.vocoder import load_bigvgan

    with pytest.raises(CheckpointError, match="BigVGAN folder not found"):
        load_bigvgan(tmp_path / "nowhere")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="no config.json"):
        load_bigvgan(empty)
    shutil.copy(folder / "config.json", empty / "config.json")
    with pytest.raises(CheckpointError, match="no bigvgan_generator.pt"):
        load_bigvgan(empty)
    (empty / "config.json").write_text("{broken")
    with pytest.raises(CheckpointError, match="unreadable"):
        load_bigvgan(empty)


def test_weights_that_do_not_fit_the_config(folder, tmp_path):
    from engine.loading.vocoder import load_bigvgan

    other = tmp_path / "other"
    shutil.copytree(folder, other)
    h = json.loads((other / "config.json").read_text())
    h["upsample_initial_channel"] *= 2
    (other / "config.json").write_text(json.dumps(h))
    with pytest.raises(CheckpointError, match="does not match its architecture: .*shape mismatch"):
        load_bigvgan(other)
    h["activation"] = "relu"
    (other / "config.json").write_text(json.dumps(h))
    with pytest.raises(CheckpointError, match="activation must be"):
        load_bigvgan(other)


def test_v4_vocoder_roundtrip_and_bad_files(tmp_path, folder):
    from engine.loading.vocoder import load_v4_vocoder
    from engine.testweights.v3v4 import write_v4_vocoder

    path = write_v4_vocoder(tmp_path / "vocoder.pth")
    sd = torch.load(path, weights_only=True)
    assert "ups.0.weight" in sd and not any(k.endswith("weight_g") for k in sd)
    assert "conv_post.bias" in sd  # is_bias=True
    net = load_v4_vocoder(tmp_path)  # a folder holding vocoder.pth works too
    assert net(torch.randn(1, 100, 3) - 5).shape == (1, 1, 3 * 480)
    with pytest.raises(CheckpointError, match="BigVGAN checkpoint, not the v4 vocoder"):
        load_v4_vocoder(folder / "bigvgan_generator.pt")
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError):
        load_v4_vocoder(tmp_path / "junk.pth")
    with pytest.raises(CheckpointError, match="not found"):
        load_v4_vocoder(tmp_path / "missing.pth")
