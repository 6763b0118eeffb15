"""The HTTP server: ``create_app(studio, settings) -> FastAPI``.

Responsibilities: (1) wire the api_v2-compatible routes, the OpenAI-compatible speech route,
``/metrics`` and ``/health`` to one :class:`engine.studio.Studio`, behind the guard
(:mod:`studio.http.guard`: request ids, credentials, body limits, last-resort errors, counting);
(2) own what a running server shares — the worker pool, the admission, the metrics, the voice
profiles, the folder rules — in a :class:`ServerContext` made per app (no module globals: two apps in
one process, or the web UI mounting this one, never share state). Nothing happens at import; blocking
model work runs only on the worker threads.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from studio.http.context import ServerContext, ServerSettings, default_weight_roots

if TYPE_CHECKING:
    from fastapi import FastAPI

    from engine.studio import Studio


def create_app(studio: "Studio", settings: ServerSettings = ServerSettings(),
               on_control: Callable[[str], None] | None = None) -> "FastAPI":
    """The FastAPI app serving ``studio``.

    Routes: ``/tts`` (GET query or POST JSON/multipart, official api_v2 names), ``/set_gpt_weights``,
    ``/set_sovits_weights``, ``/set_refer_audio``, ``/control``, ``POST /v1/audio/speech`` (OpenAI;
    ``voice`` names a saved profile), ``/v1/voices``, ``/metrics`` (Prometheus) and ``/health``.
    ``on_control(command)`` handles ``/control?command=restart|exit`` when the settings enable it (an API
    key or ``allow_control``); otherwise ``/control`` answers 403.
    """
    from contextlib import asynccontextmanager

    from fastapi import FastAPI

    from studio.http import api_v2, openai
    from studio.http.guard import Guard

    ctx = _context(studio, settings, on_control)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await _first_thread_hop()
        _route_contexts(app)
        yield
        ctx.drain()
        ctx.runner.shutdown(wait=False)
        close_text_workers = getattr(ctx.studio, "close_text_workers", None)  # tests may serve a stand-in studio
        if close_text_workers is not None:
            close_text_workers()  # the engine's text worker processes end with the server

    app = FastAPI(title="SoVITS Studio", description="GPT-SoVITS voice cloning (api_v2-compatible, OpenAI speech)",
                  version="0.1.0", lifespan=lifespan)
    app.state.context = ctx
    _add_error_handlers(app)
    app.include_router(api_v2.router(ctx))
    app.include_router(openai.router(ctx))
    _add_service_routes(app, ctx)
    app.add_middleware(Guard, ctx=ctx, api=app)  # outermost of ours: sees every answer, 401 and 413 included
    return app


async def _first_thread_hop() -> None:
    """The event loop's first hop to a worker thread (what a sync route and a request body read take), at start:
    it imports anyio's asyncio backend (~0.1 s on a busy CPU, the loop blocked meanwhile), which would otherwise
    fall on the first request."""
    from starlette.concurrency import run_in_threadpool

    await run_in_threadpool(lambda: None)


def _route_contexts(app) -> None:
    """What FastAPI looks up at each route's first call (its source file and line, for error messages: a read
    and tokenize of the module), at start rather than on the first request. Its cache is FastAPI's own."""
    from fastapi import routing

    extract = getattr(routing, "_extract_endpoint_context", None)  # FastAPI's; without it, nothing to do
    if extract is None:
        return
    routes = list(app.routes)
    while routes:
        route = routes.pop()
        routes += getattr(getattr(route, "original_router", None), "routes", [])  # an included router's own
        call = getattr(getattr(route, "dependant", None), "call", None)
        if call is not None:
            extract(call)


def _context(studio: "Studio", settings: ServerSettings, on_control: Callable[[str], None] | None) -> ServerContext:
    from studio.http.exchange import Admission
    from studio.http.metrics import ServerMetrics, register_engine_metrics
    from studio.http.profiles import ProfileStore
    from studio.http.runner import SynthesisRunner

    def cache_stats() -> dict[str, tuple[int, int]]:
        ref, pool = studio.references.stats(), studio.pool.stats()
        return {"reference": (ref.hits, ref.misses), "model_pool": (pool.hits, pool.loads)}

    from engine.decode_budget import process_decode_budget

    limits = settings.limits
    process_decode_budget().resize(limits.decode_budget_bytes)  # one budget per process: the server sizes it
    metrics = ServerMetrics(cache_stats=cache_stats, queue_length=lambda: runner.queue_length)
    register_engine_metrics(metrics.registry, studio)
    engine_capacity = getattr(studio, "capacity", lambda: 0)
    admitted = limits.admission(engine_capacity)  # fixed, or sized from the engine's slots once it has them
    runner = SynthesisRunner(limits.workers, limits.max_inflight - limits.workers,
                             on_start=lambda: metrics.in_progress.add(1), on_end=lambda: metrics.in_progress.add(-1),
                             capacity=admitted if limits.max_queue is None else None)
    roots = settings.weight_roots or studio.settings.weight_roots or default_weight_roots(studio)
    return ServerContext(
        studio=studio, settings=settings, runner=runner, metrics=metrics,
        admission=Admission(admitted, limits.retry_after_s, limits.max_uploads_per_client),
        profiles=ProfileStore(settings.profiles_dir, limits.max_upload_bytes, limits.max_profiles,
                              limits.max_profiles_bytes) if settings.profiles_dir else None,
        reference_roots=tuple(Path(r).resolve() for r in settings.reference_roots),
        weight_roots=tuple(str(r) for r in roots), on_control=on_control,
        super_sampler=_super_sampler(studio),
    )


def _add_error_handlers(app: "FastAPI") -> None:
    """Engine errors and HTTP errors become JSON answers here; anything else is the guard's 500."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from engine.errors import EngineError
    from studio.http.errors import error_json, error_response, validation_error

    @app.exception_handler(EngineError)
    async def _engine_error(request: Request, exc: EngineError) -> JSONResponse:
        return error_response(request, exc, app.state.context.limits.retry_after_s)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        ex = request.scope.get("state", {}).get("exchange")
        body = error_json(request.scope, exc.status_code, str(exc.detail), ex.id if ex else "-")
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(request, validation_error(exc.errors()))


def _add_service_routes(app: "FastAPI", ctx: ServerContext) -> None:
    from fastapi.responses import JSONResponse, PlainTextResponse

    from studio.http.metrics import CONTENT_TYPE

    @app.get("/metrics", include_in_schema=False)
    async def prometheus():
        return PlainTextResponse(ctx.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/health")
    async def health():
        """``starting`` while the warm-up runs, then ``ready``; ``degraded`` (with a ``reason``) when the warm-up
        failed, while the engine rebuilds its decoding state after a failed step (it still serves), and when
        no synthesis slot has been free for longer than ``request_timeout_s``;
        ``failed`` (503) when it could not (restart); ``draining`` (503) once shutdown has begun."""
        draining = ctx.admission.draining
        readiness = getattr(ctx.studio, "readiness", None)  # engine.warmup.Readiness, when a warm-up was started
        status = "draining" if draining else (readiness.status if readiness is not None else "ready")
        reason = getattr(readiness, "error", "") if status == "degraded" else ""  # why the warm-up failed
        engine = getattr(ctx.studio, "serving_state", "ok")  # "ok", "degraded" or "failed"
        if engine == "failed" and status != "draining":
            status = "failed"
        elif engine == "degraded" and status == "ready":
            status = "degraded"
        runner_full = getattr(ctx.runner, "full_for", None)
        stuck = max(ctx.admission.full_for(), runner_full() if runner_full is not None else 0.0)
        if stuck > ctx.limits.request_timeout_s and status == "ready":  # every slot taken longer than a request
            status = "degraded"  # may take: held by clients or workers that do not let go, not by work
            reason = (f"no synthesis slot has been free for {stuck:.0f} s, longer than a request may take "
                      f"(request_timeout_s = {ctx.limits.request_timeout_s:g} s); new requests get 503")
        load = getattr(ctx.studio, "load", None)  # the engine's schedulers: requests waiting for a slot
        engine_queued = load()["queued"] if load is not None else 0
        body = {"status": status, "running": max(0, ctx.runner.running - engine_queued),
                "queued": ctx.runner.queue_length + engine_queued, "admitted": ctx.admission.active,
                "capacity": ctx.admission.capacity, "uptime_seconds": round(time.time() - ctx.started, 1)}
        if reason:
            body["reason"] = reason
        if hasattr(ctx.studio, "stage_plan"):  # where each stage runs, in which precision and why (MPS fallbacks)
            from engine.stage_report import stage_report

            body["stages"] = stage_report(ctx.studio)
        return JSONResponse(body, status_code=503 if status in ("draining", "failed") else 200)


def _super_sampler(studio):
    """The store of the v3 AP-BWE model, at the official place under the model set's root (loaded on first use)."""
    from engine.acoustic.super_sampling import SuperSamplerStore

    base = getattr(getattr(studio, "default_weights", None), "base_dir", None)
    runtime = getattr(studio, "runtime", None)
    return None if base is None else SuperSamplerStore.for_weights(base, getattr(runtime, "device", "cpu"))
