"""A random AP-BWE super-sampling model in the official layout: ``g_24kto48k.zip`` (``{"generator":
state_dict}``, a ``torch.save`` file) and its ``config.json``, small by default."""

from __future__ import annotations

import json
from pathlib import Path

import torch

SMALL = {"n_fft": 64, "hop_size": 16, "win_size": 64, "hr_sampling_rate": 48000, "lr_sampling_rate": 24000,
         "ConvNeXt_channels": 32, "ConvNeXt_layers": 2}
FULL = {**SMALL, "n_fft": 1024, "hop_size": 80, "win_size": 320, "ConvNeXt_channels": 512, "ConvNeXt_layers": 8}


def write_ap_bwe(folder: str | Path, full_size: bool = False, seed: int = 0) -> Path:
    """Write ``folder/g_24kto48k.zip`` and ``folder/config.json``; returns the checkpoint's path."""
    from engine.loading.checkpoints import save_torch_file
    from engine.models.ap_bwe import APBWE, APBWEDims

    config = FULL if full_size else SMALL
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = APBWE(APBWEDims.from_config(config))
    for p in model.parameters():  # small random weights keep the output bounded
        p.data.normal_(0.0, 0.02)
    (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    path = folder / "g_24kto48k.zip"
    save_torch_file({"generator": model.state_dict()}, path)
    return path
