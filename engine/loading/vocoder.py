"""Vocoder files -> modules: the BigVGAN folder (v3) and ``vocoder.pth`` (v4), as the official ``TTS.py``
``TTS.init_vocoder`` loads them.

* BigVGAN: a folder with ``config.json`` and ``bigvgan_generator.pt`` (``{"generator": state_dict}``),
  stored with weight norm (``weight_g``/``weight_v``) or already without it. The pairs are folded
  exactly as ``remove_weight_norm()`` does, so the result equals the official model after
  ``from_pretrained`` + ``remove_weight_norm``.
* v4: a bare state dict of the HiFi-GAN ``Generator`` saved after weight-norm removal. The
  architecture is the one TTS.py hard-codes; only ``upsample_initial_channel`` is read from the file.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.errors import CheckpointError
from engine.loading.checkpoints import load_torch_file, state_dict_diff, state_dict_of

BIGVGAN_CONFIG = "config.json"
BIGVGAN_WEIGHTS = "bigvgan_generator.pt"


@dataclass(frozen=True)
class V4VocoderDims:
    """Arguments of ``Generator`` in ``TTS.init_vocoder("v4")``; ``upsample_initial_channel`` comes from the file."""

    initial_channel: int = 100
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    upsample_rates: tuple[int, ...] = (10, 6, 2, 2, 2)
    upsample_initial_channel: int = 512
    upsample_kernel_sizes: tuple[int, ...] = (20, 12, 4, 4, 4)
    sampling_rate: int = 48000

    @property
    def hop(self) -> int:
        return math.prod(self.upsample_rates)


def fold_weight_norm_pairs(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``X.weight_g`` + ``X.weight_v`` -> ``X.weight`` (``torch._weight_norm``, dim 0, as remove_weight_norm)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        if key.endswith(".weight_g"):
            base = key[: -len(".weight_g")]
            v = sd.get(base + ".weight_v")
            if v is None:
                raise CheckpointError(f"weight-norm pair incomplete: {key} has no {base}.weight_v")
            out[base + ".weight"] = torch._weight_norm(v.float(), value.float(), 0)
        elif key.endswith(".weight_v"):
            if key[: -len(".weight_v")] + ".weight_g" not in sd:
                raise CheckpointError(f"weight-norm pair incomplete: {key} has no weight_g")
        else:
            out[key] = value
    return out


def _load_strict(module: torch.nn.Module, sd: dict[str, torch.Tensor], path: os.PathLike | str, what: str) -> None:
    own = module.state_dict()
    diff = state_dict_diff(own, sd)
    if diff.missing or diff.unexpected or diff.wrong_shape:
        parts = []
        if diff.missing:
            parts.append(f"missing {len(diff.missing)} keys (e.g. {diff.missing[0]})")
        if diff.unexpected:
            parts.append(f"{len(diff.unexpected)} unexpected keys (e.g. {diff.unexpected[0]})")
        if diff.wrong_shape:
            parts.append(f"shape mismatch at {diff.shape_note(own, sd)}")
        raise CheckpointError(f"{what} {path} does not match its architecture: " + "; ".join(parts))
    module.load_state_dict({k: v.to(own[k].dtype) for k, v in sd.items()}, strict=True)


def read_bigvgan_config(folder: str | os.PathLike):
    """The ``BigVGANDims`` of a BigVGAN folder (CheckpointError if the folder or its config is bad)."""
    from engine.models.bigvgan import BigVGANDims

    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(
            f"BigVGAN folder not found: {folder}. Download nvidia/bigvgan_v2_24khz_100band_256x "
            f"(config.json + bigvgan_generator.pt) into it"
        )
    cfg = folder / BIGVGAN_CONFIG
    if not cfg.is_file():
        raise CheckpointError(f"BigVGAN folder {folder} has no {BIGVGAN_CONFIG}; copy it from the model download")
    try:
        h = json.loads(cfg.read_text(encoding="utf-8"))
        return BigVGANDims.from_config(h)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"BigVGAN config {cfg} is unreadable: {e}") from e


def load_bigvgan(folder: str | os.PathLike):
    """BigVGAN folder -> ``engine.models.bigvgan.BigVGAN`` in float32 eval mode, weight norm folded."""
    from engine.models.bigvgan import BigVGAN

    folder = Path(folder)
    dims = read_bigvgan_config(folder)
    weights = folder / BIGVGAN_WEIGHTS
    if not weights.is_file():
        raise CheckpointError(f"BigVGAN folder {folder} has no {BIGVGAN_WEIGHTS}; copy it from the model download")
    sd = state_dict_of(load_torch_file(weights, "BigVGAN weights"), weights, key="generator")
    try:
        model = BigVGAN(dims)
    except ValueError as e:
        raise CheckpointError(f"BigVGAN config in {folder}: {e}") from e
    _load_strict(model, fold_weight_norm_pairs(sd), weights, "BigVGAN weights")
    return model.eval()


def v4_vocoder_dims_from_state_dict(sd: dict[str, torch.Tensor]) -> V4VocoderDims:
    if "conv_pre.weight" not in sd:
        raise CheckpointError("not a v4 vocoder state dict: no conv_pre.weight")
    out_ch, in_ch, _ = sd["conv_pre.weight"].shape
    return V4VocoderDims(initial_channel=int(in_ch), upsample_initial_channel=int(out_ch))


def build_v4_vocoder(dims: V4VocoderDims):
    from engine.models.hifigan import Generator

    return Generator(
        dims.initial_channel,
        dims.resblock_kernel_sizes,
        dims.resblock_dilation_sizes,
        dims.upsample_rates,
        dims.upsample_initial_channel,
        dims.upsample_kernel_sizes,
        gin_channels=0,
        is_bias=True,
    )


def load_v4_vocoder(path: str | os.PathLike):
    """``vocoder.pth`` -> HiFi-GAN ``Generator`` (48 kHz, 480x) in float32 eval mode."""
    path = Path(path)
    if path.is_dir():
        path = path / "vocoder.pth"
    obj = load_torch_file(path, "v4 vocoder")
    if isinstance(obj, dict) and "generator" in obj:
        raise CheckpointError(f"{path} is a BigVGAN checkpoint, not the v4 vocoder (gsv-v4-pretrained/vocoder.pth)")
    sd = state_dict_of(obj, path, key=None)
    if any(k.endswith((".weight_g", ".weight_v")) for k in sd):
        sd = fold_weight_norm_pairs(sd)  # tolerate a file saved before remove_weight_norm
    model = build_v4_vocoder(v4_vocoder_dims_from_state_dict(sd))
    _load_strict(model, sd, path, "v4 vocoder")
    return model.eval()
