"""SSL (HuBERT) features for prompt tokens (official ``TTS.py`` ``TTS._set_prompt_semantic``).

The official ``chinese-hubert-base`` folder is a HuggingFace Hubert folder (``config.json`` +
``pytorch_model.bin``/``model.safetensors`` [+ ``preprocessor_config.json``]). The TTS prompt path
feeds the **raw** 16 kHz waveform to the model (no feature-extractor normalisation) after appending
``int(32000 * 0.3) = 9600`` zeros, and uses ``last_hidden_state``.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Sequence
from pathlib import Path

import torch
from torch.nn.utils.rnn import pad_sequence

from engine.errors import CheckpointError
from engine.models.sovits_modules import sequence_mask

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


def with_prompt_pad(wav16k: torch.Tensor, sovits_sample_rate: int = 32000) -> torch.Tensor:
    """HuBERT's input on the TTS.py prompt path: the 16 kHz waveform and the zero padding quirk after it."""
    pad = torch.zeros(prompt_pad_samples(sovits_sample_rate), dtype=wav16k.dtype, device=wav16k.device)
    return torch.cat([wav16k, pad])


def prompt_ssl_features(model: torch.nn.Module, wav16k: torch.Tensor, sovits_sample_rate: int = 32000) -> torch.Tensor:
    """The TTS.py prompt path: append the zero padding quirk, then :func:`ssl_features`."""
    return ssl_features(model, with_prompt_pad(wav16k, sovits_sample_rate))


@torch.no_grad()
def ssl_features_batch(model: torch.nn.Module, wavs16k: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """:func:`ssl_features` of several waveforms in one right-padded batch: per row (1, hidden, T_h), what the
    row alone gives up to rounding. The feature encoder's convolutions are unpadded, so a row's frames see
    only its own samples, except through a GroupNorm over time (chinese-hubert-base's first layer), whose
    statistics are taken over the row's own frames here; the transformer masks the padding. One waveform
    alone runs :func:`ssl_features` itself."""
    if len(wavs16k) == 1:
        return [ssl_features(model, wavs16k[0])]
    param = next(model.parameters())
    lengths = torch.tensor([w.numel() for w in wavs16k])
    x = pad_sequence([w.reshape(-1) for w in wavs16k], batch_first=True).to(device=param.device, dtype=param.dtype)
    h, frames = x[:, None], lengths
    for layer in model.feature_extractor.conv_layers:
        frames = (frames - layer.conv.kernel_size[0]) // layer.conv.stride[0] + 1
        norm = getattr(layer, "layer_norm", None)
        if isinstance(norm, torch.nn.GroupNorm):
            h = layer.activation(_group_norm_over(layer.conv(h), norm, frames))
        else:  # no norm, or a LayerNorm of each frame: padding changes nothing
            h = layer(h)
    features = h.transpose(1, 2)  # (B, T, conv_dim)
    samples = sequence_mask(lengths, x.shape[1]).to(param.device)
    mask = model._get_feature_vector_attention_mask(features.shape[1], samples)
    hidden = model.encoder(model.feature_projection(features), attention_mask=mask)[0]  # (B, T, hidden)
    return [hidden[i : i + 1, : int(n)].transpose(1, 2) for i, n in enumerate(frames.tolist())]


def _group_norm_over(h: torch.Tensor, norm: torch.nn.GroupNorm, frames: torch.Tensor) -> torch.Tensor:
    """``norm(h)`` for (B, C, T) whose row b holds ``frames[b]`` valid frames: each row's group statistics over
    its valid frames only (float32), as the row alone would have them."""
    b, c, t = h.shape
    g = norm.num_groups
    valid = sequence_mask(frames.to(h.device), t).view(b, 1, 1, t)
    x = h.float().view(b, g, c // g, t)
    count = (frames.to(h.device).float() * (c // g)).view(b, 1, 1, 1)
    mean = (x * valid).sum(dim=(2, 3), keepdim=True) / count
    var = (((x - mean) * valid) ** 2).sum(dim=(2, 3), keepdim=True) / count
    y = ((x - mean) / torch.sqrt(var + norm.eps)).view(b, c, t)
    if norm.affine:
        y = y * norm.weight.float().view(1, c, 1) + norm.bias.float().view(1, c, 1)
    return y.to(h.dtype)


def ssl_features_groups(items: Sequence[tuple[torch.nn.Module, torch.Tensor]]) -> list[torch.Tensor]:
    """``(model, waveform)`` pairs -> :func:`ssl_features` of each, one :func:`ssl_features_batch` per model
    (the batch function of a :class:`engine.batching.GroupRunner` that many requests share)."""
    from engine.batching import per_model

    return per_model(ssl_features_batch)(items)
