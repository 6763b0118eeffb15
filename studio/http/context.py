"""What one HTTP server holds: its deployment settings (:class:`ServerSettings`, with every limit in
:class:`~studio.http.limits.ServerLimits`) and the state its routes share (:class:`ServerContext`: the
engine, the worker pool, the admission, the metrics, the saved voices and the folder rules). Made per app
by :func:`studio.http.app.create_app`; no module globals.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import OptionsError
from studio.http.auth import Access
from studio.http.limits import ServerLimits

if TYPE_CHECKING:
    from engine.studio import Studio
    from studio.http.exchange import Admission

MIB = 1 << 20


@dataclass(frozen=True)
class ServerSettings:
    """Deployment choices of one HTTP server (never model or synthesis defaults)."""

    reference_roots: tuple[str, ...] = ()  # folders `ref_audio_path` may name files in; empty: uploads only
    weight_roots: tuple[str, ...] = ()  # folders weight paths may lie in; empty: those of the default weights
    profiles_dir: str = ""  # saved voices for /v1/audio/speech; empty: none
    voice_uploads: bool = True  # allow POST/DELETE /v1/voices (when profiles_dir is set)
    limits: ServerLimits = ServerLimits()  # every bound: sizes, queue, time, audio, shutdown grace
    access: Access = Access()  # API keys or Basic logins every route needs; none: open
    allow_control: bool = False  # /control without an API key (with keys it is always on)
    allowed_hosts: tuple[str, ...] = ()  # host names served without an API key besides IP literals and
    # localhost (studio.http.origins: the DNS-rebinding and cross-site check)

    def __post_init__(self) -> None:
        if not isinstance(self.limits, ServerLimits):
            raise OptionsError("limits must be a ServerLimits", field="limits")
        for name in ("reference_roots", "weight_roots"):
            roots = getattr(self, name)
            if isinstance(roots, str) or not all(isinstance(r, (str, os.PathLike)) for r in roots):
                raise OptionsError(f"{name} must be a tuple of folder paths", field=name)

    @property
    def control_enabled(self) -> bool:
        """Process control (/control) needs an API key, or an explicit --allow-control."""
        return bool(self.access.api_keys) or self.allow_control


class PathRefused(OptionsError):
    """A server-side path a request may not use. The message is the same whether the file exists or not."""


@dataclass
class ServerContext:
    """What the routes of one app share. Made by :func:`create_app`."""

    studio: "Studio"
    settings: ServerSettings
    runner: Any  # the synthesis worker pool / scheduler front (run, stream, running, queue_length, shutdown)
    metrics: Any  # ServerMetrics
    admission: "Admission"
    profiles: Any | None  # ProfileStore
    reference_roots: tuple[Path, ...]
    weight_roots: tuple[str, ...]
    on_control: Callable[[str], None] | None = None
    started: float = field(default_factory=time.time)
    super_sampler: Any | None = None  # engine.acoustic.super_sampling.SuperSamplerStore (v3 super_sampling)

    @property
    def limits(self) -> ServerLimits:
        return self.settings.limits

    @property
    def access(self) -> Access:
        return self.settings.access

    def drain(self) -> None:
        """Shutdown has begun: admit nothing new, answer queued requests 503 (running ones continue): the
        server's own queue and the engine's (requests waiting for a decoding slot)."""
        self.admission.drain()
        drain = getattr(self.studio, "drain", None)
        if drain is not None:
            from studio.http.exchange import SHUTTING_DOWN

            drain(SHUTTING_DOWN)

    def bounded(self, options: Any) -> Any:
        """``options`` with the server's token cap applied (SynthesisOptions.early_stop_num)."""
        cap = self.limits.max_tokens_per_sentence
        if cap is None or (options.early_stop_num is not None and options.early_stop_num <= cap):
            return options
        return options.replace(early_stop_num=cap)

    # ---- path rules ------------------------------------------------------------------------
    def reference_path(self, value: Any, field_name: str = "reference.audio") -> Path:
        """A reference clip named by a server-side path: it must resolve (symlinks followed) to a file
        inside one of the reference folders. Relative paths are tried against each folder, then the
        working directory (where official clients expect them). Every refusal reads the same, so the
        answer never tells whether a file outside the folders exists."""
        if not isinstance(value, str) or not value.strip():
            raise OptionsError("a reference clip is required", field=field_name)
        check_path_length(value, field_name)
        if not self.reference_roots:
            raise OptionsError("server-side reference paths are disabled here; upload the clip (multipart "
                               "field ref_audio) or use a saved voice", field=field_name)
        try:
            given = Path(value)
            candidates = [given] if given.is_absolute() else [*(r / given for r in self.reference_roots),
                                                              Path.cwd() / given]
            for candidate in candidates:
                resolved = candidate.resolve()
                if any(resolved == r or r in resolved.parents for r in self.reference_roots) and resolved.is_file():
                    return resolved
        except (OSError, ValueError, RuntimeError):  # a NUL, a name too long for the file system, a surrogate,
            pass  # a symlink loop (RuntimeError from resolve): refused like the rest
        raise PathRefused(f"{shown(value)} is not a file in the server's reference folders", field=field_name)

    def weight_path(self, value: Any, field_name: str) -> Path:
        """A weight file inside the allowed weight folders; one message for every refusal."""
        from engine.loading.model_pool import WeightPathError, check_weight_path

        check_path_length(value, field_name)
        try:
            if "\x00" not in str(value):
                return check_weight_path(value, self.weight_roots, field_name)
        except (WeightPathError, OSError, ValueError, RuntimeError):  # RuntimeError: a symlink loop
            pass
        raise PathRefused(f"{shown(str(value))} is not a weight file in the server's weight folders", field=field_name)


MAX_PATH_CHARS = 4096  # PATH_MAX on Linux: a longer path is refused before the file system sees it


def check_path_length(value: Any, field_name: str) -> None:
    """PathRefused for a path longer than :data:`MAX_PATH_CHARS` (checked before any file system call)."""
    if isinstance(value, str) and len(value) > MAX_PATH_CHARS:
        raise PathRefused(f"a path of {len(value)} characters; at most {MAX_PATH_CHARS} are accepted",
                          field=field_name)


def shown(value: str, limit: int = 120) -> str:
    """A client's value quoted for a message, cut to ``limit`` characters."""
    return repr(value if len(value) <= limit else value[:limit] + "...")


def default_weight_roots(studio: "Studio") -> tuple[str, ...]:
    w = studio.default_weights
    return tuple(dict.fromkeys(str(Path(p).resolve().parent) for p in (w.gpt, w.sovits)))

