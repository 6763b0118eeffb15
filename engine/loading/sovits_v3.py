"""SoVITS v3/v4 ``.pth`` -> ``SynthesizerTrnV3`` (official ``TTS.py`` ``TTS.init_vits_weights``), including LoRA files.

* Full files: ``{"weight": fp16 state dict, "config": hps, "info": ...}``; ``wns1`` is stored with
  weight norm (folded here). The enc_p sizes come from ``hps["model"]``; the ``wns1`` and DiT sizes
  from the tensors themselves, so shrunk test models load as well as the official ones.
* LoRA files (``03``/``04`` header, ``"lora_rank"`` key): only the trained tensors. They are applied
  over the version's base model exactly as the official PEFT ``merge_and_unload`` does with
  ``lora_alpha == r``: ``W <- W + B @ A`` for ``to_q``/``to_k``/``to_v``/``to_out.0``; every other
  tensor of the LoRA file replaces the base one.

The version cannot always be read from a file (full v3 fine-tunes are saved as plain zips with no
version header, official ``process_ckpt.py`` ``get_sovits_version_from_path_fast``), so the
caller may pass it; otherwise the header / pretrained md5 / size rules decide, and failing those the
``model.version`` the WebUI writes into hps (the official loader would misread such a file as v2).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from engine.errors import CheckpointError
from engine.loading.checkpoints import (
    as_plain_dict,
    load_torch_file,
    sovits_version_from_file,
    state_dict_diff,
    state_dict_of,
)
from engine.models.dit import dit_dims_from_state_dict
from engine.models.sovits_modules import fold_weight_norm
from engine.models.sovits_v3 import SoVITSV3Dims, SynthesizerTrnV3
from engine.versions import VOCODER_VERSIONS

PEFT_PREFIX = "cfm.base_model.model."
LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")
TRAINING_ONLY = ("enc_q.", "linear_mel.")


def _count(sd: dict, stem: str) -> int:
    return len({k[len(stem) :].split(".", 1)[0] for k in sd if k.startswith(stem)})


def dims_from_checkpoint(sd: dict[str, torch.Tensor], hps: dict, version: str) -> SoVITSV3Dims:
    try:
        wn_key = "wns1.enc.in_layers.0.weight_v" if "wns1.enc.in_layers.0.weight_v" in sd else "wns1.enc.in_layers.0.weight"
        return SoVITSV3Dims.from_hparams(
            hps,
            version,
            wns1_hidden=int(sd["wns1.pre.weight"].shape[0]),
            wns1_kernel=int(sd[wn_key].shape[-1]),
            wns1_layers=_count(sd, "wns1.enc.in_layers."),
            dit=dit_dims_from_state_dict(sd),
        )
    except KeyError as e:
        raise CheckpointError(f"SoVITS {version} weights or config lack {e}; is this a v3/v4 SoVITS file?") from e


def merge_lora(base: dict[str, torch.Tensor], lora: dict[str, torch.Tensor], rank: int, alpha: float | None = None) -> dict[str, torch.Tensor]:
    """Apply a LoRA file's tensors over a base state dict (both float32 here); returns a new dict."""
    scale = (alpha if alpha is not None else rank) / rank
    out = dict(base)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in lora.items():
        if key.startswith(PEFT_PREFIX):
            inner = "cfm." + key[len(PEFT_PREFIX) :]
            for side in ("lora_A", "lora_B"):
                marker = f".{side}.default.weight"
                if inner.endswith(marker):
                    pairs.setdefault(inner[: -len(marker)], {})[side] = value.float()
                    break
            else:
                out[inner.replace(".base_layer.", ".")] = value
        else:
            out[key] = value
    for target, ab in pairs.items():
        if set(ab) != {"lora_A", "lora_B"}:
            raise CheckpointError(f"LoRA file has an incomplete A/B pair for {target}")
        if not target.endswith(LORA_TARGETS):
            raise CheckpointError(f"LoRA tensor for an unexpected layer {target}")
        w = target + ".weight"
        if w not in out:
            raise CheckpointError(f"LoRA layer {target} is not in the base model")
        out[w] = out[w].float() + (ab["lora_B"] @ ab["lora_A"]) * scale
    return out


def _resolve_version(path: Path, version: str | None, hps_version: str | None) -> tuple[str, bool]:
    _, file_version, is_lora = sovits_version_from_file(path)
    if version is None:
        if file_version in VOCODER_VERSIONS:
            return file_version, is_lora
        if hps_version in VOCODER_VERSIONS:  # the WebUI writes hps.model.version; the official loader ignores it
            return hps_version, is_lora
        raise CheckpointError(
            f"cannot tell from {path} whether it is a v3 or v4 SoVITS file (small files carry no "
            "version mark); pass version='v3' or 'v4'"
        )
    if version not in VOCODER_VERSIONS:
        raise CheckpointError(f"load_sovits_v3 loads v3/v4 files, not {version!r}")
    if is_lora and file_version != version:
        raise CheckpointError(f"{path} is a {file_version} LoRA file but {version} was requested")
    return version, is_lora


def load_sovits_v3(path: str | os.PathLike, version: str | None = None,
                   base_path: str | os.PathLike | None = None) -> SynthesizerTrnV3:
    """A v3/v4 SoVITS file -> ``SynthesizerTrnV3`` in float32 eval mode.

    ``version``: "v3" or "v4" when the file does not say (see the module docstring).
    ``base_path``: the version's pretrained base model (s2Gv3.pth / s2Gv4.pth); required for LoRA files.
    """
    path = Path(path)
    obj = load_torch_file(path, "SoVITS v3/v4 weights")
    if not isinstance(obj, dict) or "weight" not in obj:
        raise CheckpointError(f"{path} is not a GPT-SoVITS SoVITS (.pth) file: no 'weight' entry")
    try:
        hps_version = as_plain_dict(obj["config"]).get("model", {}).get("version") if "config" in obj else None
    except CheckpointError:
        hps_version = None
    version, is_lora = _resolve_version(path, version, hps_version)
    sd = state_dict_of(obj, path)
    if is_lora or "lora_rank" in obj:
        if base_path is None:
            raise CheckpointError(
                f"{path} is a {version} LoRA file: it needs the {version} base model (s2G{version}.pth); pass base_path"
            )
        rank = obj.get("lora_rank")
        if not isinstance(rank, int) or rank <= 0:
            raise CheckpointError(f"LoRA file {path} has no valid lora_rank ({rank!r})")
        base_obj = load_torch_file(base_path, f"SoVITS {version} base weights")
        base_sd = state_dict_of(base_obj, base_path)
        hps = as_plain_dict(base_obj["config"]) if "config" in base_obj else as_plain_dict(obj["config"])
        base_sd = {k: v.float() for k, v in fold_weight_norm(base_sd).items()}
        sd = merge_lora(base_sd, fold_weight_norm(sd), rank)
    else:
        if "config" not in obj:
            raise CheckpointError(f"{path} has no 'config' (hps); not an official SoVITS file")
        hps = as_plain_dict(obj["config"])
        sd = fold_weight_norm(sd)
    sd = {k: v for k, v in sd.items() if not k.startswith(TRAINING_ONLY)}
    dims = dims_from_checkpoint(sd, hps, version)
    model = SynthesizerTrnV3(dims)
    own = model.state_dict()
    diff = state_dict_diff(own, sd)
    if diff.missing or diff.wrong_shape:
        what = f"missing {len(diff.missing)} tensors (e.g. {diff.missing[0]})" if diff.missing else ""
        if diff.wrong_shape:
            what += ("; " if what else "") + f"shape mismatch at {diff.shape_note(own, sd)}"
        raise CheckpointError(f"SoVITS {version} weights {path} do not fit the model: {what}")
    model.load_state_dict({k: sd[k] for k in own}, strict=True)  # extra keys are ignored, as strict=False does
    return model.float().eval()
