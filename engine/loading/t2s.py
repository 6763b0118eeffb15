"""GPT (s1) ``.ckpt`` file -> :class:`Text2SemanticModel`, with its dims read from the file."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.errors import CheckpointError
from engine.loading.checkpoints import as_plain_dict, load_torch_file, state_dict_diff, state_dict_of
from engine.models.t2s import T2SDims, Text2SemanticModel

PREFIX = "model."
HZ = 50  # the official early_stop_num is hz * max_sec


@dataclass(frozen=True)
class T2SCheckpoint:
    """What a GPT checkpoint says about itself (no module built)."""

    path: Path
    dims: T2SDims
    config: dict
    info: str
    weights: dict[str, torch.Tensor]  # without the "model." prefix

    @property
    def max_sec(self) -> int:
        return int(self.config.get("data", {}).get("max_sec", 54))

    @property
    def early_stop_num(self) -> int:
        return HZ * self.max_sec

    @property
    def symbol_version(self) -> str:
        return "v1" if self.dims.phoneme_vocab_size == 512 else "v2"


def read_t2s_checkpoint(path: str | os.PathLike) -> T2SCheckpoint:
    path = Path(path)
    obj = load_torch_file(path, "GPT weights")
    if not isinstance(obj, dict) or "config" not in obj or "weight" not in obj:
        keys = sorted(obj)[:6] if isinstance(obj, dict) else type(obj).__name__
        raise CheckpointError(
            f"{path} is not a GPT-SoVITS GPT (.ckpt) file: expected keys 'weight' and 'config', found {keys}"
        )
    weights = state_dict_of(obj, path, "weight")
    if not all(k.startswith(PREFIX) for k in weights):
        odd = next(k for k in weights if not k.startswith(PREFIX))
        hint = " (it looks like SoVITS weights; pass it as the SoVITS model)" if odd.startswith(("enc_p.", "dec.")) else ""
        raise CheckpointError(f"{path} is not a GPT (.ckpt) file: key {odd!r} lacks the 'model.' prefix{hint}")
    config = as_plain_dict(obj["config"])
    try:
        proj = weights.get(PREFIX + "bert_proj.weight")
        dims = T2SDims.from_config(config.get("model", {}), bert_dim=proj.shape[1] if proj is not None else 1024)
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from e
    stripped = {k[len(PREFIX):]: v for k, v in weights.items()}
    return T2SCheckpoint(path=path, dims=dims, config=config, info=str(obj.get("info", "")), weights=stripped)


def build_t2s(ckpt: T2SCheckpoint, device: torch.device | str = "cpu",
              dtype: torch.dtype = torch.float32) -> Text2SemanticModel:
    """Strict load of the checkpoint into a fresh module, then ``.to(device, dtype).eval()``."""
    model = Text2SemanticModel(ckpt.dims)
    own = model.state_dict()
    diff = state_dict_diff(own, ckpt.weights)
    if diff.missing or diff.unexpected:
        raise CheckpointError(
            f"{ckpt.path}: GPT weights do not match the architecture in its config "
            f"(missing {diff.missing[:3]}, unexpected {diff.unexpected[:3]})"
        )
    if diff.wrong_shape:
        raise CheckpointError(f"{ckpt.path}: a tensor's shape differs from what the config implies "
                              f"(model.{diff.shape_note(own, ckpt.weights)})")
    model.load_state_dict({k: v.float() for k, v in ckpt.weights.items()}, strict=True)
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)


def load_t2s(path: str | os.PathLike, device: torch.device | str = "cpu",
             dtype: torch.dtype = torch.float32) -> tuple[Text2SemanticModel, T2SCheckpoint]:
    ckpt = read_t2s_checkpoint(path)
    return build_t2s(ckpt, device, dtype), ckpt


def describe_t2s(ckpt: T2SCheckpoint) -> dict[str, Any]:
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in ckpt.weights.values()})
    return {
        "kind": "gpt",
        "version": ckpt.symbol_version,
        "dims": ckpt.dims.to_config(),
        "max_sec": ckpt.max_sec,
        "parameters": sum(t.numel() for t in ckpt.weights.values()),
        "dtype": ",".join(dtypes),
        "info": ckpt.info,
    }
