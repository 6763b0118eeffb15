"""Audio files for tests that no real clip would give cheaply."""

from __future__ import annotations

import struct
from pathlib import Path


def write_hour_long_wav(path: Path, sr: int = 8000, seconds: int = 3600) -> None:
    """A valid PCM16 wav header for an hour of audio over a sparse (all-zero) data chunk: no disk cost."""
    n_bytes = sr * seconds * 2
    header = b"RIFF" + struct.pack("<I", 36 + n_bytes) + b"WAVE"
    header += b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, sr, sr * 2, 2, 16)
    header += b"data" + struct.pack("<I", n_bytes)
    with open(path, "wb") as f:
        f.write(header)
        f.truncate(len(header) + n_bytes)
