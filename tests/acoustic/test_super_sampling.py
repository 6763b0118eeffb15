"""v3 super-sampling (AP-BWE, 24 -> 48 kHz) from random weights in the official file layout."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine.acoustic.super_sampling import load_ap_bwe, load_super_sampler
from engine.errors import CheckpointError
from engine.testweights.ap_bwe import write_ap_bwe

# parameter names of the official checkpoint (tools/AP_BWE_main/models/model.py)
OFFICIAL_NAMES = {"conv_pre_mag.weight", "norm_pre_pha.bias", "convnext_mag.0.dwconv.weight", "convnext_pha.1.gamma",
                  "convnext_mag.1.pwconv2.weight", "norm_post_mag.weight", "linear_post_mag.bias",
                  "linear_post_pha_r.weight", "linear_post_pha_i.bias"}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_ap_bwe(tmp_path_factory.mktemp("ap_bwe") / "tools" / "AP_BWE_main" / "24kto48k")


def test_the_official_layout_loads_and_widens_24_to_48_khz(checkpoint) -> None:
    model = load_ap_bwe(checkpoint)
    assert OFFICIAL_NAMES <= set(model.state_dict())
    sampler = load_super_sampler(checkpoint)
    t = np.arange(24000) / 24000
    audio = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)  # 1 s at 24 kHz
    wide, rate = sampler(audio, 24000)
    again, _ = sampler(torch.from_numpy(audio), 24000)
    assert rate == 48000 and wide.dtype == np.float32 and abs(len(wide) - 48000) <= 16
    assert np.isfinite(wide).all() and np.abs(wide).max() <= 1.0 and np.abs(wide).max() > 0
    np.testing.assert_array_equal(wide, again)


def test_a_checkpoint_that_does_not_fit_its_config_is_named(checkpoint, tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**json.loads((checkpoint.parent / "config.json").read_text()),
                                                      "ConvNeXt_channels": 48}))
    (tmp_path / "g_24kto48k.zip").write_bytes(checkpoint.read_bytes())
    with pytest.raises(CheckpointError, match="does not fit config.json"):
        load_ap_bwe(tmp_path / "g_24kto48k.zip")
    (tmp_path / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config not found"):
        load_ap_bwe(tmp_path / "g_24kto48k.zip")
