"""SSL (HuBERT) features for prompt tokens (official ``TTS.py`` ``TTS._set_prompt_semantic``).

The official ``chinese-hubert-base`` folder is a HuggingFace Hubert folder (``config.json`` +
``pytorch_model.bin``/``model.safetensors`` [+ ``preprocessor_config.json``]). The TTS prompt path
feeds the **raw** 16 kHz waveform to the model (no feature-extractor normalisation) after appending
``int(32000 * 0.3) = 9600`` zeros, and uses ``last_hidden_state``.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch

from engine.errors import CheckpointError

SSL_SAMPLE_RATE = 16000
# TTS.py appends int(configs.sampling_rate * 0.3) zeros, with the *SoVITS* rate (32 kHz): 0.6 s at 16 kHz.
PROMPT_PAD_SECONDS_AT_SOVITS_RATE = 0.3


def prompt_pad_samples(sovits_sample_rate: int = 32000) -> int:
    """Number of zeros TTS.py appends to the 16 kHz prompt audio (9600 for the 32 kHz SoVITS rate)."""
    return int(sovits_sample_rate * PROMPT_PAD_SECONDS_AT_SOVITS_RATE)


def load_hubert(folder: str | os.PathLike) -> torch.nn.Module:
    """``HubertModel.from_pretrained(folder, local_files_only=True)`` in eval mode, float32 on CPU.

    Raises CheckpointError naming the folder when it is missing, incomplete or not a Hubert model.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"HuBERT folder not found: {folder} (expected the chinese-hubert-base folder)")
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"HuBERT folder {folder} has no config.json; copy the whole chinese-hubert-base folder")
    weights = [n for n in ("model.safetensors", "pytorch_model.bin") if (folder / n).is_file()]
    if not weights:
        raise CheckpointError(f"HuBERT folder {folder} has no model.safetensors or pytorch_model.bin")
    from transformers import HubertConfig, HubertModel
    from transformers.utils import logging as hf_logging

    try:
        config = HubertConfig.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"HuBERT folder {folder}: unreadable config.json ({e})") from e
    if config.model_type != "hubert":
        raise CheckpointError(f"{folder} holds a {config.model_type!r} model, not hubert")
    verbosity = hf_logging.get_verbosity()
    try:
        hf_logging.set_verbosity_error()  # the unused masked_spec_embed etc. are expected
        model = HubertModel.from_pretrained(folder, local_files_only=True, dtype=torch.float32)
    except (OSError, ValueError, RuntimeError, pickle.UnpicklingError, EOFError) as e:  # a corrupt weight file
        raise CheckpointError(f"HuBERT folder {folder}: cannot load weights ({e})") from e
    finally:
        hf_logging.set_verbosity(verbosity)
    return model.eval()


@torch.no_grad()
def ssl_features(model: torch.nn.Module, wav16k: torch.Tensor) -> torch.Tensor:
    """Raw 16 kHz waveform (n,) -> last hidden state (1, hidden, T_h), ``T_h = (n - 400) // 320 + 1``."""
    param = next(model.parameters())
    x = wav16k.to(device=param.device, dtype=param.dtype).unsqueeze(0)  # (1, n)
    return model(x)["last_hidden_state"].transpose(1, 2)


def prompt_ssl_features(model: torch.nn.Module, wav16k: torch.Tensor, sovits_sample_rate: int = 32000) -> torch.Tensor:
    """The TTS.py prompt path: append the zero padding quirk, then :func:`ssl_features`."""
    pad = torch.zeros(prompt_pad_samples(sovits_sample_rate), dtype=wav16k.dtype, device=wav16k.device)
    return ssl_features(model, torch.cat([wav16k, pad]))
