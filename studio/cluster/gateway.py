"""The cluster's front door: receives every HTTP request, finds the model set it needs and forwards it to
a synthesis replica (Serve routes it to one holding that set), streaming the replica's answer back.

Responsibilities: (1) forwarding with clear failures: a replica that dies under a request makes it answer
503 with ``Retry-After`` (send it again: Serve replaces the replica, the others keep serving); (2) what
concerns the whole cluster: ``/health`` (the replicas), ``/metrics`` (every replica's, labelled by
replica) and the default weights, which ``/set_gpt_weights``/``/set_sovits_weights`` change for all.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from starlette.responses import JSONResponse, PlainTextResponse, Response

from studio.cluster.asgi import ForwardedRequest, ResponseStart
from studio.cluster.routing import Defaults, ModelSet, model_set_for, weight_path

if TYPE_CHECKING:
    from starlette.requests import Request

    from studio.cluster.config import ClusterConfig

log = logging.getLogger(__name__)
STATE_WAIT_S = 2.0  # longest wait for the cluster state on a request's path (while it restarts: the last copy)


class Unavailable(Exception):
    """No replica could answer this request; the client may send it again."""


def replica_lost(exc: BaseException) -> bool:
    """True for errors that mean a replica (or the way to it) failed, not the request."""
    from ray import exceptions as rex
    from ray.serve import exceptions as sex

    return isinstance(exc, (rex.RayActorError, rex.ActorUnavailableError, rex.WorkerCrashedError,
                            rex.NodeDiedError, sex.BackPressureError, sex.DeploymentUnavailableError))


def unavailable_response(path: str, message: str) -> Response:
    """503 with ``Retry-After``, in the error shape of the path (OpenAI's under /v1/, api_v2's elsewhere)."""
    from studio.cluster.failures import RETRY_AFTER_S, unavailable_body

    return Response(unavailable_body(path, message), status_code=503, media_type="application/json",
                    headers={"Retry-After": str(RETRY_AFTER_S)})


class Gateway:
    """The ingress deployment's class: a plain ``__call__``, so every path comes here."""

    def __init__(self, synthesizer: Any, state: Any, config: "ClusterConfig") -> None:
        self.synthesizer = synthesizer  # DeploymentHandle of the Synthesizer replicas
        self.state = state  # DeploymentHandle of ClusterState
        self.config = config
        self.weight_roots = config.weight_roots()
        self._defaults: Defaults | None = None
        self._defaults_at = 0.0
        self.lost_requests = 0

    async def __call__(self, request: "Request") -> Response:
        from starlette.exceptions import HTTPException

        path = request.url.path
        try:
            if path == "/health":
                return await self.health()
            if path == "/metrics":
                return await self.metrics()
            forwarded = await self._read(request)
            if path in ("/set_gpt_weights", "/set_sovits_weights"):
                return await self.set_weights(forwarded, "gpt" if path == "/set_gpt_weights" else "sovits")
            defaults = await self.defaults()
            models = model_set_for(forwarded, defaults.models, self.weight_roots, self.config.voices_dir)
            return await self.forward(forwarded, models, defaults)
        except Unavailable as e:
            return unavailable_response(path, str(e))
        except HTTPException as e:
            return JSONResponse({"message": str(e.detail)}, status_code=e.status_code)

    # ---- forwarding --------------------------------------------------------------------------
    async def _read(self, request: "Request") -> ForwardedRequest:
        """The whole request, its body capped at ``max_upload_bytes`` (413 beyond, as ``serve``)."""
        from starlette.exceptions import HTTPException

        limit = self.config.max_upload_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise HTTPException(413, f"request body: {declared} bytes; the limit is {limit} (max_upload_bytes)")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise HTTPException(413, f"request body: more than {limit} bytes; the limit is {limit} "
                                         f"(max_upload_bytes)")
        client = request.client
        return ForwardedRequest(request.method, request.url.path, request.scope.get("query_string", b""),
                                tuple((bytes(k), bytes(v)) for k, v in request.scope.get("headers", ())),
                                bytes(body), (client.host, client.port) if client else None)

    async def forward(self, request: ForwardedRequest, models: ModelSet | None,
                      defaults: Defaults | None) -> "RelayedResponse":
        """Send ``request`` to a replica (one holding ``models`` when given) and relay its answer."""
        handle = self.synthesizer.options(stream=True, multiplexed_model_id=models.id if models else "")
        stream = handle.handle.remote(request, defaults)
        try:
            start = await stream.__anext__()
        except Exception as e:
            if not replica_lost(e) and not isinstance(e, StopAsyncIteration):
                raise
            self._count_lost()
            log.warning("%s %s: no answer from the replica: %r", request.method, request.path, e)
            raise Unavailable(f"the replica computing this request stopped ({type(e).__name__}); the "
                              f"cluster is replacing it: send the request again") from e
        if not isinstance(start, ResponseStart):
            raise TypeError(f"a replica answered {type(start).__name__} before the response start")
        return RelayedResponse(start, stream, on_lost=self._count_lost)

    def _count_lost(self) -> None:
        """One more request lost with its replica: counted here and, for the whole cluster, by the state."""
        self.lost_requests += 1
        try:
            self.state.count_lost.remote()  # fire and forget: a restarting state misses this one
        except Exception as e:  # noqa: BLE001
            log.debug("lost request not counted by the state: %s", e)

    # ---- the cluster's own routes ------------------------------------------------------------
    async def defaults(self, fresh: bool = False) -> Defaults:
        """The cluster's default weights, asked of the state on every request (another gateway may have
        changed them a moment ago). While the state does not answer within STATE_WAIT_S (it is restarting),
        this gateway's last copy; ``fresh``: the state's answer or Unavailable."""
        try:
            self._defaults = await self._ask_state(self.state.defaults, wait=None if fresh else STATE_WAIT_S)
            self._defaults_at = time.monotonic()
        except Exception as e:
            if self._defaults is None or fresh or not (replica_lost(e) or isinstance(e, asyncio.TimeoutError)):
                raise Unavailable(f"the cluster state is not reachable ({type(e).__name__}); retry") from e
            log.warning("cluster state not answering (%r); using the default weights of %.0f s ago", e,
                        time.monotonic() - self._defaults_at)
        return self._defaults

    async def _ask_state(self, method: Any, *args: Any, wait: float | None = STATE_WAIT_S) -> Any:
        """``method.remote(*args)`` of the state, waiting at most ``wait`` seconds (None: 30 s)."""
        return await asyncio.wait_for(_awaited(method.remote(*args)), timeout=wait or 30.0)

    async def set_weights(self, request: ForwardedRequest, kind: str) -> Response:
        """A replica loads and checks the weights and gives the api_v2 answer; on success they become
        the default of every replica (each follows before its next request)."""
        defaults = await self.defaults(fresh=True)
        value = parse_qs(request.query_string.decode("latin-1")).get("weights_path", [None])[-1]
        path = weight_path(value, self.weight_roots)
        target = defaults.models.replace(**{kind: path}) if path else None
        answer = await self.forward(request, target, defaults)
        if target is None or answer.status_code != 200:
            return answer  # the replica's own message (missing, outside the folders, not loadable)
        body = b"".join([chunk async for chunk in answer.chunks()])
        self._defaults = await self._ask_state(self.state.set_defaults, target, wait=None)
        self._defaults_at = time.monotonic()
        return Response(body, status_code=200, headers=answer.relayed_headers())

    async def health(self) -> Response:
        try:
            reports = await self._ask_state(self.state.replicas)
            defaults = await self.defaults(fresh=True)
        except Exception as e:  # noqa: BLE001 - say so rather than fail the health check
            return JSONResponse({"status": "unavailable", "message": f"cluster state: {type(e).__name__}: {e}"},
                                status_code=503)
        try:
            state = await self._ask_state(self.state.describe)
        except Exception as e:  # noqa: BLE001 - a courtesy field
            state = {"error": f"{type(e).__name__}: {e}"}
        body = {
            "status": "ok" if reports else "unavailable",
            "replicas": [report.to_json(age) for report, age in reports],
            "replicas_live": len(reports),
            "replicas_wanted": self.config.replica_bounds(),
            "requests_lost": state.get("requests_lost", self.lost_requests),  # every gateway's
            "default_weights": defaults.models.to_json(),
            "deployment": deployment_status(self.config.app_name),
            "gateway": {"pid": os.getpid()},  # the gateway replica that answered
            "state": state,
        }
        return JSONResponse(body, status_code=200 if reports else 503)

    async def metrics(self) -> Response:
        from studio.cluster.metrics import gauge, merge_expositions
        from studio.http.metrics import CONTENT_TYPE

        reports = await self._ask_state(self.state.replicas, wait=None)
        lost = (await self._ask_state(self.state.describe, wait=None))["requests_lost"]
        text = merge_expositions({report.replica: report.metrics for report, _ in reports})
        text += gauge("sovits_cluster_replicas", "Replicas that reported in the last few seconds.",
                      [({}, len(reports))])
        text += gauge("sovits_cluster_requests_lost", "Requests the gateways answered 503 because their replica "
                      "stopped (since the cluster state started).", [({}, lost)])
        return PlainTextResponse(text, media_type=CONTENT_TYPE)


async def _awaited(response: Any) -> Any:
    return await response


def deployment_status(app_name: str) -> dict[str, Any]:
    """Serve's view of the replica deployment (its status and replica states), {} where it cannot say."""
    try:
        from ray import serve

        app = serve.status().applications.get(app_name)
        deployment = app.deployments.get("Synthesizer") if app else None
    except Exception as e:  # noqa: BLE001 - a courtesy field of /health
        log.debug("serve.status failed: %s", e)
        return {}
    if deployment is None:
        return {}
    status = getattr(deployment.status, "value", deployment.status)
    return {"status": str(status), "replica_states": {str(k): v for k, v in deployment.replica_states.items()}}


class RelayedResponse(Response):
    """A replica's answer relayed as it comes: status and headers first, then each chunk (Serve sends a
    Starlette response that a deployment returns by calling it as an ASGI app)."""

    def __init__(self, start: ResponseStart, stream: Any, on_lost: Callable[[], None] | None = None) -> None:
        self.background = None
        self.status_code = start.status
        self.raw_headers = list(start.headers)
        self._stream = stream
        self._on_lost = on_lost

    def relayed_headers(self) -> dict[str, str]:
        skip = {b"content-length", b"transfer-encoding"}
        return {k.decode("latin-1"): v.decode("latin-1") for k, v in self.raw_headers if k not in skip}

    async def chunks(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def __call__(self, scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            async for chunk in self._stream:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except asyncio.CancelledError:
            self._stream.cancel()  # the client left: stop the replica's work
            raise
        except Exception as e:
            if replica_lost(e) and self._on_lost is not None:
                self._on_lost()
            log.error("the replica stopped in the middle of a response: %r", e)
            raise  # the status line is sent: the client sees the body end early
        await send({"type": "http.response.body", "body": b"", "more_body": False})
