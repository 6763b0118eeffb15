"""Audio seconds of a WAV body as it arrives (streamed or whole)."""

from __future__ import annotations

import struct
import time
from collections.abc import Callable


class WavMeter:
    """Counts the audio of a WAV body as it arrives: the header (``fmt `` gives the byte rate, the
    ``data`` chunk where samples start), then PCM bytes. A streamed WAV declares 0 (or 0xFFFFFFFF)
    data bytes and runs to the end; a whole file counts only its declared data."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._head = b""
        self.byte_rate: int | None = None  # bytes per second of audio
        self.sample_rate: int | None = None
        self._declared: int | None = None
        self.data_bytes = 0
        self.first_audio_at: float | None = None
        self.error: str | None = None

    def feed(self, piece: bytes) -> None:
        if self.error:
            return
        if self._declared is None:
            self._head += piece
            piece = self._parse_header()
            if self._declared is None:
                return
        if piece and self.first_audio_at is None:
            self.first_audio_at = self._clock()
        self.data_bytes += len(piece)

    def _parse_header(self) -> bytes:
        h = self._head
        if len(h) >= 12 and (h[:4] != b"RIFF" or h[8:12] != b"WAVE"):
            self.error = "not a WAV stream"
            return b""
        pos = 12
        while len(h) >= pos + 8:
            cid, size = h[pos:pos + 4], struct.unpack("<I", h[pos + 4:pos + 8])[0]
            if cid == b"data":
                if self.byte_rate is None:
                    self.error = "the WAV data chunk comes before its fmt chunk"
                    return b""
                self._declared = size
                return h[pos + 8:]
            if len(h) < pos + 8 + size:
                return b""
            if cid == b"fmt ":
                _, channels, rate, _, _, bits = struct.unpack("<HHIIHH", h[pos + 8:pos + 24])
                self.sample_rate, self.byte_rate = rate, rate * channels * max(1, bits // 8)
            pos += 8 + size + (size & 1)
        return b""

    @property
    def audio_bytes(self) -> int:
        if self._declared in (None, 0, 0xFFFFFFFF):
            return self.data_bytes
        return min(self.data_bytes, self._declared)

    @property
    def audio_s(self) -> float:
        return self.audio_bytes / self.byte_rate if self.byte_rate else 0.0
