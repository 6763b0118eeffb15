"""A streaming ``gr.Audio`` output whose chunks are encoded to AAC with PyAV (its wheels ship FFmpeg).

Gradio encodes each streamed chunk with pydub, which needs an ``ffmpeg`` program on PATH; a fresh
install has none. :func:`streaming_audio` gives the one component we create its own encoder (the
server's AAC encoder) instead. It sets an attribute on that instance only (subclassing a Gradio
component would make Gradio write a ``.pyi`` stub beside this file at import).
"""

from __future__ import annotations

import io
from typing import Any

import anyio
import gradio as gr
import numpy as np
import soundfile as sf


def wav_to_adts(data: bytes) -> tuple[bytes, float]:
    """WAV bytes -> (AAC ADTS bytes, duration in seconds)."""
    from engine.audio_formats import encode_aac, to_pcm16

    samples, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)  # (n, channels)
    mono = samples.mean(axis=1) if samples.shape[1] > 1 else samples[:, 0]
    return encode_aac(to_pcm16(np.ascontiguousarray(mono)), int(rate)), samples.shape[0] / rate


async def _to_adts(data: bytes) -> tuple[bytes, float]:
    return await anyio.to_thread.run_sync(wav_to_adts, data)


def streaming_audio(**kwargs: Any) -> gr.Audio:
    """``gr.Audio(streaming=True, **kwargs)`` that needs no ffmpeg program."""
    audio = gr.Audio(streaming=True, **kwargs)
    audio.covert_to_adts = _to_adts  # (sic) Gradio's name; Audio.stream_output calls self.covert_to_adts
    return audio
