"""v3 "super-sampling": widen a 24 kHz clip to 48 kHz with AP-BWE, as the official ``TTS.run`` does
when ``super_sampling`` is on and the model is v3 (``tools/audio_sr.py``).

The official weights are a user download (not on the hub): ``g_24kto48k.zip`` (a ``torch.save``
file holding ``{"generator": state_dict}``) with a ``config.json`` beside it, in
``tools/AP_BWE_main/24kto48k/`` of a GPT-SoVITS folder. :func:`load_super_sampler` reads that pair
without running code from it. The steps: resample to the wide-band rate, STFT (log amplitude and
phase), the network, inverse STFT; a result louder than full scale is normalised, as the official code does.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from engine.errors import CheckpointError
from engine.models.ap_bwe import APBWE, APBWEDims

OFFICIAL_PATH = Path("tools") / "AP_BWE_main" / "24kto48k" / "g_24kto48k.zip"  # under the GPT-SoVITS root


def load_ap_bwe(checkpoint: str | os.PathLike) -> APBWE:
    """The AP-BWE network of ``checkpoint`` (its ``config.json`` beside it), float32 on CPU, eval mode."""
    from engine.loading.checkpoints import load_torch_file, state_dict_diff, state_dict_of

    checkpoint = Path(checkpoint)
    config_file = checkpoint.parent / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"AP-BWE config not found: {config_file} (it comes with {checkpoint.name})")
    try:
        dims = APBWEDims.from_config(json.loads(config_file.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{config_file} is not an AP-BWE config ({e})") from e
    weights = state_dict_of(load_torch_file(checkpoint, "AP-BWE weights"), checkpoint, key="generator")
    model = APBWE(dims)
    diff = state_dict_diff(model.state_dict(), weights)
    if diff.missing or diff.wrong_shape:
        detail = diff.shape_note(model.state_dict(), weights) if diff.wrong_shape else f"lacks {diff.missing[0]}"
        raise CheckpointError(f"{checkpoint} does not fit {config_file.name}: {detail}")
    model.load_state_dict({k: v for k, v in weights.items() if k not in diff.unexpected})
    return model.float().eval()


@dataclass(frozen=True)
class SuperSampler:
    """A loaded AP-BWE model; ``sampler(audio, rate) -> (audio, wide-band rate)`` on the model's device."""

    model: APBWE

    @property
    def sample_rate(self) -> int:
        return self.model.dims.hr_sampling_rate

    @torch.inference_mode()
    def __call__(self, audio: np.ndarray | torch.Tensor, sample_rate: int) -> tuple[np.ndarray, int]:
        import torchaudio.functional as AF

        d = self.model.dims
        param = next(self.model.parameters())
        x = torch.as_tensor(audio, dtype=torch.float32).reshape(1, -1).to(param.device)  # (1, n)
        x = AF.resample(x, orig_freq=sample_rate, new_freq=d.hr_sampling_rate)
        window = torch.hann_window(d.win_size, device=x.device)
        spec = torch.stft(x, d.n_fft, hop_length=d.hop_size, win_length=d.win_size, window=window, center=True,
                          pad_mode="reflect", normalized=False, return_complex=True)  # (1, bins, frames)
        log_amp, phase = self.model(torch.log(spec.abs() + 1e-4), torch.angle(spec))
        wide = torch.polar(torch.exp(log_amp), phase)
        out = torch.istft(wide, d.n_fft, hop_length=d.hop_size, win_length=d.win_size, window=window, center=True)
        out = out.reshape(-1).cpu().numpy().astype(np.float32)
        peak = float(np.abs(out).max()) if out.size else 0.0
        return (out / peak if peak > 1 else out), d.hr_sampling_rate


def load_super_sampler(checkpoint: str | os.PathLike, device: str | torch.device = "cpu") -> SuperSampler:
    return SuperSampler(load_ap_bwe(checkpoint).to(device))


class SuperSamplerStore:
    """Owns the one AP-BWE model of a deployment: loaded on first use, then kept (thread-safe).

    ``get()`` is None while the checkpoint is absent (the official code then leaves the audio as it is;
    callers should say so): ``path`` names where it belongs.
    """

    def __init__(self, path: str | os.PathLike, device: str | torch.device = "cpu") -> None:
        import threading

        self.path, self.device = Path(path), device
        self._sampler: SuperSampler | None = None
        self._lock = threading.Lock()

    @classmethod
    def for_weights(cls, base_dir: str | os.PathLike, device: str | torch.device = "cpu") -> "SuperSamplerStore":
        """The store at the official place under a model set's root (the GPT-SoVITS folder)."""
        return cls(Path(base_dir) / OFFICIAL_PATH, device)

    def get(self) -> SuperSampler | None:
        with self._lock:
            if self._sampler is None and self.path.is_file():
                self._sampler = load_super_sampler(self.path, self.device)
            return self._sampler
