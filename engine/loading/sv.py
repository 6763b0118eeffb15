"""Speaker-verification checkpoint (``sv/pretrained_eres2netv2w24s4ep4.ckpt``) -> ERes2NetV2 (official
``GPT_SoVITS/sv.py``, ``SV.__init__``).

The official file is a plain state dict loaded strictly into ``ERes2NetV2(baseWidth=24, scale=4,
expansion=4)`` (sizes hard-coded in ``sv.py``). We read the sizes from the tensors instead, which
gives exactly those for the official file and lets shrunk test files load too.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from engine.errors import CheckpointError
from engine.loading.checkpoints import load_torch_file, state_dict_diff, state_dict_of
from engine.models.sv import ERes2NetV2, ERes2NetV2Dims


def load_sv_model(path: str | os.PathLike, device: torch.device | str = "cpu",
                  dtype: torch.dtype = torch.float32) -> ERes2NetV2:
    """Strictly load the ERes2NetV2 speaker-verification weights; CheckpointError names what is wrong."""
    path = Path(path)
    obj = load_torch_file(path, "speaker-verification weights")
    if isinstance(obj, dict) and "weight" in obj and "config" in obj:
        raise CheckpointError(
            f"{path} is a GPT-SoVITS model file (it has 'weight' and 'config'), not the ERes2NetV2 "
            "speaker-verification checkpoint (sv/pretrained_eres2netv2w24s4ep4.ckpt)"
        )
    try:
        sd = state_dict_of(obj, path, key=None)
    except CheckpointError as e:
        raise CheckpointError(f"{e} (expected the ERes2NetV2 speaker-verification checkpoint)") from e
    try:
        dims = ERes2NetV2Dims.from_state_dict(sd)
    except (KeyError, ValueError, ZeroDivisionError) as e:
        raise CheckpointError(
            f"{path} is not the ERes2NetV2 speaker-verification checkpoint (eres2netv2w24s4ep4): {e!r}"
        ) from e
    with torch.device("meta"):  # no random init: every tensor comes from the file
        model = ERes2NetV2(dims)
    own = model.state_dict()
    diff = state_dict_diff(own, sd)
    if diff.missing or diff.unexpected:
        raise CheckpointError(
            f"{path} is not the ERes2NetV2 speaker-verification checkpoint (eres2netv2w24s4ep4): "
            f"{len(diff.missing)} tensors missing (e.g. {diff.missing[:2]}), "
            f"{len(diff.unexpected)} unexpected (e.g. {diff.unexpected[:2]})"
        )
    if diff.wrong_shape:
        raise CheckpointError(f"{path}: tensor shape differs, {diff.shape_note(own, sd)}")
    model.load_state_dict({k: v.to(own[k].dtype).contiguous() for k, v in sd.items()}, strict=True, assign=True)
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)
