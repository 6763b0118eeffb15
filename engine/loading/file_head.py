"""The first bytes of a weight file: what the official SoVITS version detection reads before loading.

The official ``process_ckpt.get_sovits_version_from_path_fast`` looks up the md5 of a file's first
8 KiB in its table of pretrained files, then reads the 2-byte tag that ``process_ckpt.my_save2``
writes over the zip's ``PK``. Both readers live here, free of torch, for loading and for verifying
downloads.
"""

from __future__ import annotations

import hashlib
import os

HEAD_BYTES = 8192  # the span the official pretrained-file md5 covers


def read_header(path: str | os.PathLike) -> bytes:
    """The first two bytes of a file (``b"PK"`` for a plain torch zip)."""
    with open(path, "rb") as f:
        return f.read(2)


def md5_head(path: str | os.PathLike, size: int = HEAD_BYTES) -> str:
    """md5 (hex) of a file's first ``size`` bytes, the key of the official pretrained-file table."""
    with open(path, "rb") as f:
        return hashlib.md5(f.read(size)).hexdigest()
