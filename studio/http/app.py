"""The HTTP server: ``create_app(studio, settings) -> FastAPI``.

Responsibilities: (1) wire the api_v2-compatible routes, the OpenAI-compatible speech route and
``/metrics`` to one :class:`engine.pipeline.Studio`; (2) own what a running server shares — the
bounded worker pool, the metrics, the voice profiles, the folder rules — in a :class:`ServerContext`
made per app (no module globals: two apps in one process, or the web UI mounting this one, never
share state). Nothing happens at import; blocking model work runs only on the worker threads.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import EngineError, OptionsError
from studio.http.context import ServerContext, ServerSettings, default_weight_roots

if TYPE_CHECKING:
    from fastapi import FastAPI

    from engine.pipeline import Studio

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

    from studio.http import api_v2, openai
    from studio.http.errors import BodyLimitMiddleware, error_response
    from studio.http.metrics import CONTENT_TYPE, ServerMetrics, register_engine_metrics
    from studio.http.profiles import ProfileStore
    from studio.http.runner import SynthesisRunner

    def cache_stats() -> dict[str, tuple[int, int]]:
        ref, pool = studio.references.stats(), studio.pool.stats()
        return {"reference": (ref.hits, ref.misses), "model_pool": (pool.hits, pool.loads)}

    metrics = ServerMetrics(cache_stats=cache_stats, queue_length=lambda: runner.queue_length)
    register_engine_metrics(metrics.registry, studio)
    runner = SynthesisRunner(settings.workers, settings.max_queue,
                             on_start=lambda: metrics.in_progress.add(1), on_end=lambda: metrics.in_progress.add(-1))
    roots = settings.weight_roots or studio.settings.weight_roots or default_weight_roots(studio)
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
        from studio.http.errors import describe_validation_error

        return error_response(request, OptionsError(describe_validation_error(exc.errors())))

    app.include_router(api_v2.router(ctx))
    app.include_router(openai.router(ctx))

    @app.get("/metrics", include_in_schema=False)
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/health")
    async def health() -> dict:
        readiness = getattr(studio, "readiness", None)  # "starting" while a warm-up runs (engine.warmup)
        return {"status": readiness.status if readiness is not None else "ready", "running": runner.running,
                "queued": runner.queue_length,
                "uptime_seconds": round(time.time() - ctx.started, 1)}

    return app
