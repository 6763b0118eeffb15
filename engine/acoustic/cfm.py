"""v3/v4 synthesis: SoVITS features -> CFM mel chunks -> vocoder audio (official ``TTS.py``
``TTS.using_vocoder_synthesis`` and ``TTS.using_vocoder_synthesis_batched_infer``).

Two paths, as in the official ``TTS.py``:

* :func:`synthesize_sequential` (``parallel_infer=False``): the features are cut into windows of
  ``chunk_len`` frames; each window is prompted by the tail of the previous generated window.
* :func:`synthesize_batched` (``parallel_infer=True``, the official default): several sentences'
  features are concatenated, cut into 12-frame-overlapping windows that all share the reference
  prompt, sampled in one CFM batch, vocoded at once and joined with SOLA.

The CFM noise is injectable (``noise``: a callable ``(shape, dtype, device) -> Tensor``, e.g.
:func:`replay_noise`), so recorded runs can be replayed. ``vocoder`` is any callable
``mel (1, 100, T) -> audio (1, 1, T * hop)``: the torch module or a Core ML wrapper.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.acoustic.mel import denorm_spec, reference_mel
from engine.acoustic.sola import SOLA_SEARCH, sola_join  # noqa: F401 (re-exported)
from engine.models.cfm import NoiseSource, gaussian_noise

Vocoder = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class VocoderConfig:
    """The ``vocoder_configs`` of ``TTS.init_vocoder``."""

    sampling_rate: int  # output rate
    t_ref: int  # most reference-mel frames used as the prompt
    t_chunk: int  # prompt + generated frames per CFM call
    upsample_rate: int  # audio samples per mel frame
    overlapped_len: int = 12  # frames of overlap between batched windows


VOCODER_CONFIGS = {
    "v3": VocoderConfig(sampling_rate=24000, t_ref=468, t_chunk=934, upsample_rate=256),
    "v4": VocoderConfig(sampling_rate=48000, t_ref=500, t_chunk=1000, upsample_rate=480),
}


@dataclass(frozen=True)
class VoicePrompt:
    """The reference side of a v3/v4 synthesis, computed once per reference."""

    features: torch.Tensor  # (1, 512, T_min) prompt features (fea_ref)
    mel: torch.Tensor  # (1, 100, T_min) normalised reference mel (mel2)
    ge: torch.Tensor  # (1, gin, 1) style vector
    refer_spec: torch.Tensor  # (1, 1025, F) linear spectrogram the style vector came from
    chunk_len: int  # generated frames per CFM window: t_chunk - T_min


def replay_noise(tensors: Sequence[torch.Tensor]) -> NoiseSource:
    """A noise source returning the given tensors in order (for replaying recorded runs)."""
    queue = list(tensors)

    def draw(shape, dtype, device):
        if not queue:
            raise ValueError("replay_noise: more CFM calls than recorded noise tensors")
        x = queue.pop(0)
        if tuple(x.shape) != tuple(shape):
            raise ValueError(f"replay_noise: recorded noise {tuple(x.shape)} but the CFM asks for {tuple(shape)}")
        return x.to(dtype=dtype, device=device)

    return draw


def prepare_prompt(
    model,  # SynthesizerTrnV3
    prompt_tokens: torch.Tensor,  # (T_p,) or (1, 1, T_p) semantic tokens of the reference
    prompt_phones: torch.Tensor,  # (P,) or (1, P) phone ids of the reference transcript
    refer_spec: torch.Tensor,  # (1, 1025, F) linear spectrogram of the reference at 32 kHz
    ref_audio: torch.Tensor,  # (channels, samples) raw reference audio
    ref_sr: int,
    config: VocoderConfig | None = None,
) -> VoicePrompt:
    """Reference features and mel, trimmed to a common length and capped to the last ``t_ref`` frames."""
    version = model.dims.version
    config = config or VOCODER_CONFIGS[version]
    tokens = prompt_tokens.reshape(1, 1, -1)
    phones = prompt_phones.reshape(1, -1)
    param_dtype = next(model.parameters()).dtype
    fea_ref, ge = model.decode_encp(tokens, phones, refer_spec.to(param_dtype))
    mel2 = reference_mel(ref_audio.to(fea_ref.device), ref_sr, version)
    t_min = min(mel2.shape[2], fea_ref.shape[2])
    mel2, fea_ref = mel2[:, :, :t_min], fea_ref[:, :, :t_min]
    if t_min > config.t_ref:
        mel2, fea_ref = mel2[:, :, -config.t_ref :], fea_ref[:, :, -config.t_ref :]
        t_min = config.t_ref
    return VoicePrompt(fea_ref, mel2.to(fea_ref.dtype), ge, refer_spec, config.t_chunk - t_min)


def target_features(model, prompt: VoicePrompt, tokens: torch.Tensor, phones: torch.Tensor, speed: float) -> torch.Tensor:
    """Target tokens (N,) / (1, 1, N) + phones -> features (1, 512, T) with the prompt's style vector."""
    fea, _ = model.decode_encp(tokens.reshape(1, 1, -1), phones.reshape(1, -1), prompt.refer_spec, prompt.ge, speed)
    return fea


def synthesize_sequential(
    model,
    vocoder: Vocoder,
    prompt: VoicePrompt,
    tokens: torch.Tensor,
    phones: torch.Tensor,
    speed: float = 1.0,
    sample_steps: int = 32,
    noise: NoiseSource | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sentence -> (audio (samples,), vocoder input mel (1, 100, T)); official ``using_vocoder_synthesis``."""
    noise = noise or gaussian_noise()
    fea_todo = target_features(model, prompt, tokens, phones, speed)
    fea_ref, mel2 = prompt.features, prompt.mel
    t_min = mel2.shape[2]
    pieces = []
    for start in range(0, fea_todo.shape[2], prompt.chunk_len):
        chunk = fea_todo[:, :, start : start + prompt.chunk_len]
        fea = torch.cat([fea_ref, chunk], 2)  # (1, 512, T_prompt + T_chunk)
        out = model.cfm.sample(fea, mel2, sample_steps, noise=noise)
        out = out[:, :, mel2.shape[2] :]
        mel2 = out[:, :, -t_min:]  # the next window continues from what was just generated
        fea_ref = chunk[:, :, -t_min:]
        pieces.append(out)
    mel = denorm_spec(torch.cat(pieces, 2))
    with torch.inference_mode():
        audio = vocoder(mel)[0][0]
    return audio, mel


def batched_windows(feats: torch.Tensor, chunk_len: int, overlap: int) -> tuple[torch.Tensor, int]:
    """(1, C, T) -> (n, C, chunk_len) windows of the left-padded features, and the last window's padding."""
    padded = F.pad(feats, (overlap, 0), "constant", 0)
    chunks, pos, padding = [], 0, 0
    while True:
        if pos > 0:
            pos -= overlap
        chunk = padded[:, :, pos : pos + chunk_len]
        pos += chunk_len
        if chunk.shape[-1] == 0:
            break
        padding = chunk_len - chunk.shape[2]
        if padding:
            chunk = F.pad(chunk, (0, padding), "constant", 0)
        chunks.append(chunk)
    return torch.cat(chunks, 0), padding


def synthesize_batched(
    model,
    vocoder: Vocoder,
    prompt: VoicePrompt,
    sentences: Sequence[tuple[torch.Tensor, torch.Tensor]],  # (tokens (N_i,), phones (P_i,)) per sentence
    speed: float = 1.0,
    sample_steps: int = 32,
    noise: NoiseSource | None = None,
    config: VocoderConfig | None = None,
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Several sentences in one CFM batch -> (audio per sentence, vocoder input mel (1, 100, n*chunk_len)).

    Official ``using_vocoder_synthesis_batched_infer``: features concatenated, overlapping windows
    sharing the reference prompt, one vocoder call, SOLA joins, split back per sentence.
    """
    if not sentences:
        raise ValueError("synthesize_batched needs at least one sentence")
    config = config or VOCODER_CONFIGS[model.dims.version]
    noise = noise or gaussian_noise()
    chunk_len, overlap, up = prompt.chunk_len, config.overlapped_len, config.upsample_rate
    feats = [target_features(model, prompt, tok, ph, speed) for tok, ph in sentences]
    lengths = [f.shape[2] for f in feats]
    windows, padding = batched_windows(torch.cat(feats, 2), chunk_len, overlap)  # (n, 512, chunk_len)
    n = windows.shape[0]
    fea = torch.cat([prompt.features.repeat(n, 1, 1), windows], 2)
    out = model.cfm.sample(fea, prompt.mel, sample_steps, noise=noise)[:, :, -chunk_len:]  # (n, 100, chunk_len)
    mel = denorm_spec(out.permute(1, 0, 2).reshape(out.shape[1], -1).unsqueeze(0))  # windows end to end
    with torch.no_grad():
        audio = vocoder(mel)[0][0]
    step = chunk_len * up
    fragments = [audio[p : p + step] for p in range(0, audio.shape[-1], step)]
    audio = sola_join(fragments, overlap * up)
    audio = audio[overlap * up : -padding * up] if padding > 0 else audio[overlap * up :]
    pieces = []
    for length in lengths:
        pieces.append(audio[: length * up])
        audio = audio[length * up :]
    return pieces, mel
