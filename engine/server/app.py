"""The HTTP server: ``create_app(studio, settings) -> FastAPI``.

Responsibilities: (1) wire the api_v2-compatible routes, the OpenAI-compatible speech route and
``/metrics`` to one :class:`engine.pipeline.Studio`; (2) own what a running server shares — the
bounded worker pool, the metrics, the voice profiles, the folder rules — in a :class:`ServerContext`
made per app (no module globals: two apps in one process, or the web UI mounting this one, never
share state). Nothing happens at import; blocking model work runs only on the worker threads.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import EngineError, OptionsError, ReferenceAudioError

if TYPE_CHECKING:
    from fastapi import FastAPI

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
        from engine.model_pool import check_weight_path

        return check_weight_path(value, self.weight_roots, field_name)


def _default_weight_roots(studio: "Studio") -> tuple[str, ...]:
    w = studio.default_weights
    return tuple(dict.fromkeys(str(Path(p).resolve().parent) for p in (w.gpt, w.sovits)))


def create_app(studio: "Studio", settings: ServerSettings = ServerSettings(),
               on_control: Callable[[str], None] | None = None) -> "FastAPI":
    """The FastAPI app serving ``studio``.

    Routes: ``/tts`` (GET query or POST JSON/multipart, official api_v2 names), ``/set_gpt_weights``,
    ``/set_sovits_weights``, ``/set_refer_audio``, ``/control``, ``POST /v1/audio/speech`` (OpenAI;
    ``voice`` names a saved profile), ``/v1/voices``, ``/metrics`` (Prometheus) and ``/health``.
    ``on_control(command)`` handles ``/control?command=restart|exit``; without it ``/control`` answers 403.
    """
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, PlainTextResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from engine.server import api_v2, openai
    from engine.server.http import BodyLimitMiddleware, error_response
    from engine.server.metrics import CONTENT_TYPE, ServerMetrics
    from engine.server.profiles import ProfileStore
    from engine.server.runner import SynthesisRunner

    def cache_stats() -> dict[str, tuple[int, int]]:
        ref, pool = studio.references.stats(), studio.pool.stats()
        return {"reference": (ref.hits, ref.misses), "model_pool": (pool.hits, pool.loads)}

    metrics = ServerMetrics(cache_stats=cache_stats, queue_length=lambda: runner.queue_length)
    runner = SynthesisRunner(settings.workers, settings.max_queue,
                             on_start=lambda: metrics.in_progress.add(1), on_end=lambda: metrics.in_progress.add(-1))
    roots = settings.weight_roots or studio.settings.weight_roots or _default_weight_roots(studio)
    ctx = ServerContext(
        studio=studio, settings=settings, runner=runner, metrics=metrics,
        profiles=ProfileStore(settings.profiles_dir, settings.max_upload_bytes) if settings.profiles_dir else None,
        reference_roots=tuple(Path(r).resolve() for r in settings.reference_roots),
        weight_roots=tuple(str(r) for r in roots), on_control=on_control,
    )

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        runner.shutdown(wait=False)

    app = FastAPI(title="SoVITS Studio", description="GPT-SoVITS voice cloning (api_v2-compatible, OpenAI speech)",
                  version="0.1.0", lifespan=lifespan)
    app.state.context = ctx
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_upload_bytes, metrics=metrics)

    @app.exception_handler(EngineError)
    async def _engine_error(request: Request, exc: EngineError) -> JSONResponse:
        return error_response(request, exc)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return error_response(request, exc)  # 500 with a JSON body (api_v2 clients read "message")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"message": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        from engine.server.http import describe_validation_error

        return error_response(request, OptionsError(describe_validation_error(exc.errors())))

    app.include_router(api_v2.router(ctx))
    app.include_router(openai.router(ctx))

    @app.get("/metrics", include_in_schema=False)
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "running": runner.running, "queued": runner.queue_length,
                "uptime_seconds": round(time.time() - ctx.started, 1)}

    return app
