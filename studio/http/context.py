"""What one HTTP server holds: its deployment settings (:class:`ServerSettings`, the one place their defaults
live) and the state its routes share (:class:`ServerContext`: the engine, the worker pool, the metrics, the
saved voices and the folder rules). Made per app by :func:`studio.http.app.create_app`; no module globals.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import OptionsError, ReferenceAudioError

if TYPE_CHECKING:
    from engine.pipeline import Studio

MIB = 1 << 20


@dataclass(frozen=True)
class ServerSettings:
    """Deployment choices of one HTTP server (never model or synthesis defaults)."""

    reference_roots: tuple[str, ...] = ()  # folders `ref_audio_path` may name files in; empty: uploads only
    weight_roots: tuple[str, ...] = ()  # folders weight paths may lie in; empty: those of the default weights
    profiles_dir: str = ""  # saved voices for /v1/audio/speech; empty: none
    voice_uploads: bool = True  # allow POST/DELETE /v1/voices (when profiles_dir is set)
    max_profiles: int = 256  # at most this many saved voices
    max_upload_bytes: int = 20 * MIB  # a request body (JSON or multipart with clips) larger than this: 413
    workers: int = 1  # synthesis threads (requests computed at once)
    max_queue: int = 32  # admitted requests waiting for a worker; beyond this: 503
    max_pending_chunks: int = 8  # streamed results waiting for a slow client before synthesis pauses
    max_tokens_per_sentence: int | None = None  # cap on semantic tokens per sentence (25 per second of
    # audio); None: the GPT checkpoint's own limit (50 * max_sec = 2700, i.e. up to ~108 s per sentence)

    def __post_init__(self) -> None:
        for name in ("max_profiles", "max_upload_bytes", "workers", "max_queue", "max_pending_chunks"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < (1 if name in ("workers",) else 0):
                raise OptionsError(f"{name} must be a non-negative integer (workers >= 1), got {v!r}")
        cap = self.max_tokens_per_sentence
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
            raise OptionsError(f"max_tokens_per_sentence must be a positive integer or None, got {cap!r}")
        for name in ("reference_roots", "weight_roots"):
            roots = getattr(self, name)
            if isinstance(roots, str) or not all(isinstance(r, (str, os.PathLike)) for r in roots):
                raise OptionsError(f"{name} must be a tuple of folder paths")


@dataclass
class ServerContext:
    """What the routes of one app share. Made by :func:`create_app`."""

    studio: "Studio"
    settings: ServerSettings
    runner: Any  # SynthesisRunner
    metrics: Any  # ServerMetrics
    profiles: Any | None  # ProfileStore
    reference_roots: tuple[Path, ...]
    weight_roots: tuple[str, ...]
    on_control: Callable[[str], None] | None = None
    started: float = field(default_factory=time.time)
    super_sampler: Any | None = None  # engine.acoustic.super_sampling.SuperSamplerStore (v3 super_sampling)

    def bounded(self, options: Any) -> Any:
        """``options`` with the server's token cap applied (SynthesisOptions.early_stop_num)."""
        cap = self.settings.max_tokens_per_sentence
        if cap is None or (options.early_stop_num is not None and options.early_stop_num <= cap):
            return options
        return options.replace(early_stop_num=cap)

    # ---- path rules ------------------------------------------------------------------------
    def reference_path(self, value: Any, field_name: str = "ref_audio_path") -> Path:
        """A reference clip named by a server-side path: it must resolve (symlinks followed) to a file
        inside one of the reference folders. Relative paths are tried against each folder, then the
        working directory (where official clients expect them)."""
        if not isinstance(value, str) or not value.strip():
            raise OptionsError(f"{field_name} is required")
        if "\x00" in value:
            raise OptionsError(f"{field_name}: the path contains a NUL character")
        if not self.reference_roots:
            raise OptionsError(f"{field_name}: server-side reference paths are disabled here; upload the clip "
                               f"(multipart field ref_audio) or use a saved voice")
        given = Path(value)
        candidates = [given] if given.is_absolute() else [*(r / given for r in self.reference_roots),
                                                          Path.cwd() / given]
        outside = False
        for candidate in candidates:
            resolved = candidate.resolve()
            inside = any(resolved == r or r in resolved.parents for r in self.reference_roots)
            if inside and resolved.is_file():
                return resolved
            outside = outside or (not inside and resolved.exists())
        if outside:
            raise OptionsError(f"{field_name}: {value!r} is outside the reference folders "
                               f"({', '.join(map(str, self.reference_roots))})")
        raise ReferenceAudioError(f"{field_name}: {value!r} not found in the reference folders "
                                  f"({', '.join(map(str, self.reference_roots))})")

    def weight_path(self, value: Any, field_name: str) -> Path:
        """A weight file inside the allowed weight folders (WeightPathError names ``field_name``)."""
        from engine.loading.model_pool import check_weight_path

        return check_weight_path(value, self.weight_roots, field_name)


def default_weight_roots(studio: "Studio") -> tuple[str, ...]:
    w = studio.default_weights
    return tuple(dict.fromkeys(str(Path(p).resolve().parent) for p in (w.gpt, w.sovits)))
