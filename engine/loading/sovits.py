"""SoVITS ``.pth`` -> module, for v1 / v2 / v2Pro / v2ProPlus (v3/v4 files go to ``sovits_v3``).

Loading follows the official ``TTS.py`` ``TTS.init_vits_weights`` and ``process_ckpt.py``
``get_sovits_version_from_path_fast``: version from the pretrained md5 / 2-byte
header / size, corrected by the weights; dims from ``hps``; non-strict loading where the only
tolerated gaps are the training-only ``enc_q`` tensors. Anything else missing is an error (a file of
another kind fails clearly), and unexpected keys are reported on the result.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.errors import CheckpointError
from engine.loading.checkpoints import (
    as_plain_dict,
    detect_sovits_version,
    load_torch_file,
    sovits_version_from_file,
    state_dict_diff,
    state_dict_of,
)
from engine.models.sovits import SV_DIM, SoVITSDims, SynthesizerTrn
from engine.models.sovits_modules import fold_weight_norm
from engine.versions import PRO_VERSIONS, VOCODER_VERSIONS

TRAINING_ONLY = ("enc_q.",)
ESSENTIAL_PREFIXES = ("enc_p.", "dec.", "flow.", "ref_enc.", "ssl_proj.", "quantizer.")


@dataclass(frozen=True)
class LoadedSoVITS:
    """A loaded SoVITS model with what its file says about itself."""

    module: nn.Module  # SynthesizerTrn (v1/v2/v2Pro*) or SynthesizerTrnV3 (v3/v4)
    dims: Any  # SoVITSDims or the v3/v4 dims
    symbol_version: str  # "v1" | "v2": the phone table
    model_version: str  # "v1" | "v2" | "v2Pro" | "v2ProPlus" | "v3" | "v4"
    is_lora: bool
    hps: dict  # the file's training hyper-parameters as plain dicts
    info: str
    path: Path
    unexpected_keys: tuple[str, ...] = ()  # in the file, not used by the model (enc_q excluded)
    notes: tuple[str, ...] = field(default_factory=tuple)  # deviations from the official reading, if any

    @property
    def sampling_rate(self) -> int:
        return int(self.hps.get("data", {}).get("sampling_rate", 32000))

    @property
    def needs_sv_embedding(self) -> bool:
        return self.model_version in PRO_VERSIONS


def _delegate_v3(path: Path, version: str | None, is_lora: bool, hps: dict | None, info: str,
                 base_path: str | os.PathLike | None, device: torch.device | str, dtype: torch.dtype) -> LoadedSoVITS:
    try:
        from engine.loading.sovits_v3 import load_sovits_v3
    except ImportError as e:
        raise CheckpointError(f"{path} is a SoVITS v3/v4 file; v3/v4 is not supported yet") from e
    module = load_sovits_v3(path, version=version, base_path=base_path).to(device=device, dtype=dtype).eval()
    if hps is None:
        hps = {}
    model_version = version or getattr(getattr(module, "dims", None), "version", "v3")
    return LoadedSoVITS(module=module, dims=getattr(module, "dims", None), symbol_version="v2",
                        model_version=model_version, is_lora=is_lora, hps=hps, info=info, path=path)


def load_sovits(path: str | os.PathLike, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float32, base_path: str | os.PathLike | None = None) -> LoadedSoVITS:
    """Load any official SoVITS ``.pth``; v1/v2/v2Pro/v2ProPlus here, v3/v4 through ``sovits_v3``.

    ``base_path``: for v3/v4 LoRA files only, the version's pretrained base model.

    Raises CheckpointError naming the file when it is not a SoVITS file, lacks essential weights, or
    its tensors do not fit the architecture its config describes.
    """
    path = Path(path)
    _, file_model, file_lora = sovits_version_from_file(path)
    if file_model in VOCODER_VERSIONS:  # header / pretrained md5 / size: do not read 750 MB twice
        return _delegate_v3(path, file_model, file_lora, None, "", base_path, device, dtype)

    obj = load_torch_file(path, "SoVITS weights")
    if not isinstance(obj, dict) or "weight" not in obj:
        found = sorted(map(str, obj))[:6] if isinstance(obj, dict) else type(obj).__name__
        raise CheckpointError(f"{path} is not a GPT-SoVITS SoVITS (.pth) file: no 'weight' entry (found {found})")
    weights = state_dict_of(obj, path, "weight")
    if weights and all(k.startswith("model.") for k in weights):
        raise CheckpointError(f"{path} holds GPT (T2S) weights; pass it as the GPT model, not as SoVITS")
    if "config" not in obj:
        raise CheckpointError(f"{path} has no 'config' (hps); not an official SoVITS file")
    hps = as_plain_dict(obj["config"])
    info = str(obj.get("info", ""))
    symbol_version, model_version, is_lora = detect_sovits_version(path, weights, hps)
    if model_version in VOCODER_VERSIONS or any(k.startswith("cfm.") for k in weights):
        return _delegate_v3(path, model_version if model_version in VOCODER_VERSIONS else None, is_lora, hps, info,
                            base_path, device, dtype)

    notes: list[str] = []
    if model_version not in PRO_VERSIONS and "sv_emb.weight" in weights:
        named = hps.get("model", {}).get("version") or hps.get("version")
        model_version = named if named in PRO_VERSIONS else "v2Pro"
        notes.append(f"file has no Pro header but holds sv_emb weights: read as {model_version}")

    missing_essential = [p for p in ESSENTIAL_PREFIXES if not any(k.startswith(p) for k in weights)]
    if missing_essential:
        raise CheckpointError(
            f"{path} is not a SoVITS model file: it has no {', '.join(p.rstrip('.') for p in missing_essential)} weights"
        )
    try:
        emb = weights["enc_p.text_embedding.weight"]
        sv = weights.get("sv_emb.weight")
        dims = SoVITSDims.from_hparams(hps, model_version, emb.shape[0], sv.shape[1] if sv is not None else SV_DIM)
    except KeyError as e:
        raise CheckpointError(f"{path}: SoVITS config or weights lack {e}") from e
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: unusable SoVITS config: {e}") from e

    with torch.device("meta"):  # no random init: every tensor comes from the file
        module = SynthesizerTrn(dims)
    sd = fold_weight_norm(weights)
    own = module.state_dict()
    diff = state_dict_diff(own, sd)
    if diff.missing:
        raise CheckpointError(
            f"SoVITS weights {path} lack {len(diff.missing)} tensors the {model_version} model needs "
            f"(e.g. {', '.join(diff.missing[:3])}); the file is truncated or of another kind"
        )
    if diff.wrong_shape:
        raise CheckpointError(f"SoVITS weights {path}: tensor {diff.shape_note(own, sd)}; the config implies the "
                              f"model's shape ({len(diff.wrong_shape)} mismatches)")
    unexpected = tuple(sorted(k for k in sd if k not in own and not k.startswith(TRAINING_ONLY)))
    module.load_state_dict({k: sd[k].to(torch.float32).contiguous() for k in own}, strict=True, assign=True)
    module = module.to(device=device, dtype=dtype).eval().requires_grad_(False)
    return LoadedSoVITS(module=module, dims=dims, symbol_version=symbol_version, model_version=model_version,
                        is_lora=is_lora, hps=hps, info=info, path=path, unexpected_keys=unexpected,
                        notes=tuple(notes))
