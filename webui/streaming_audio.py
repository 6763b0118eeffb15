"""A streaming ``gr.Audio`` output whose chunks are encoded to AAC with PyAV (its wheels ship FFmpeg).

Gradio 6 encodes a streamed output with one ``ffmpeg`` process per stream, a program a fresh install
lacks. :func:`streaming_audio` gives the one component we create its own encoder instead: a PyAV AAC
encoder with the same life cycle (one per stream, fed PCM chunk by chunk, so chunk boundaries stay
seamless). Only that instance is changed (subclassing a Gradio component would make Gradio write a
``.pyi`` stub beside this file at import).
"""

from __future__ import annotations

import io
import threading
from typing import Any

import gradio as gr
import numpy as np

AAC_FRAME = 1024  # samples per AAC-LC frame
ADTS_RATES = (96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000, 7350)


def split_adts(data: bytes) -> list[bytes]:
    """ADTS bytes -> its frames (each starts with the 0xFFF sync word and carries its own length)."""
    frames, pos = [], 0
    while pos + 7 <= len(data):
        if data[pos] != 0xFF or data[pos + 1] & 0xF0 != 0xF0:
            raise ValueError(f"no ADTS sync word at byte {pos}")
        size = ((data[pos + 3] & 0x03) << 11) | (data[pos + 4] << 3) | (data[pos + 5] >> 5)
        frames.append(bytes(data[pos:pos + size]))
        pos += size
    return frames


class PyAVAacStream:
    """One AAC-LC encoder for the life of a streamed output: 16-bit PCM in, ADTS frames out.

    The interface Gradio's stream registry expects of its encoders (``feed``, ``take``, ``flush``,
    ``close``, ``frame_duration``); encoding happens in ``feed``, on Gradio's worker thread.
    """

    def __init__(self, sample_rate: int, channels: int, bit_rate: int = 128_000) -> None:
        import av

        self.sample_rate, self.channels = sample_rate, channels
        self.output_rate = min(ADTS_RATES, key=lambda r: abs(r - sample_rate))
        self._layout = "mono" if channels == 1 else "stereo"
        self._buffer = io.BytesIO()
        self._container = av.open(self._buffer, "w", format="adts")
        self._stream = self._container.add_stream("aac", rate=self.output_rate)
        self._stream.bit_rate = bit_rate
        self._stream.layout = self._layout
        self._resampler = av.AudioResampler(format="fltp", layout=self._layout, rate=self.output_rate)
        self._lock = threading.Lock()
        self._closed = False

    @property
    def frame_duration(self) -> float:
        return AAC_FRAME / self.output_rate

    def feed(self, pcm: bytes) -> None:
        import av

        samples = np.frombuffer(pcm, dtype="<i2").reshape(-1, self.channels).T  # (channels, n)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples).reshape(1, -1), format="s16",
                                           layout=self._layout)
        frame.sample_rate = self.sample_rate
        with self._lock:
            for resampled in self._resampler.resample(frame):
                for packet in self._stream.encode(resampled):
                    self._container.mux(packet)

    def take(self, timeout: float | None = None) -> list[bytes]:  # noqa: ARG002 - encoding is synchronous
        with self._lock:
            data = self._buffer.getvalue()
            self._buffer.seek(0)
            self._buffer.truncate()
        return split_adts(data)

    def flush(self, timeout: float = 5.0) -> list[bytes]:  # noqa: ARG002
        with self._lock:
            if not self._closed:
                for resampled in self._resampler.resample(None):
                    for packet in self._stream.encode(resampled):
                        self._container.mux(packet)
                for packet in self._stream.encode(None):
                    self._container.mux(packet)
        frames = self.take()
        self.close()
        return frames

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._container.close()


def _encode_chunk(output_id: str, data: bytes):
    """Gradio's per-chunk step of a streamed output, with a PyAV encoder in the stream's slot."""
    from gradio.audio_stream_encoder import decode_to_pcm, segment_from_frames
    from gradio.components.audio import _stream_encoders

    slot = _stream_encoders.get(output_id)
    if slot is None:  # the stream ended (Stop, closed tab) while this chunk was on its way
        return None
    encoder = slot.encoder
    if encoder is None:
        rate, channels, pcm = decode_to_pcm(data)  # our chunks are 16-bit WAV: read without ffmpeg
        encoder = PyAVAacStream(rate, channels)
        if not slot.attach(encoder):
            encoder.close()
            return None
    else:
        _, _, pcm = decode_to_pcm(data, encoder.sample_rate, encoder.channels)
    encoder.feed(pcm)
    return segment_from_frames(encoder, encoder.take())


def streaming_audio(**kwargs: Any) -> gr.Audio:
    """``gr.Audio(streaming=True, **kwargs)`` that needs no ffmpeg program."""
    audio = gr.Audio(streaming=True, **kwargs)
    audio._encode_chunk = _encode_chunk  # the method Audio.stream_output calls per chunk
    return audio
