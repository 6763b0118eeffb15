"""HTTP plumbing shared by the routes: error bodies and status codes, the request-body cap, and the
per-request counter. Engine errors become 4xx with their message; nothing else leaks a traceback."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from engine.errors import EngineError

log = logging.getLogger(__name__)

# endpoints named in metrics (anything else is "other", so clients cannot blow up label cardinality)
ENDPOINTS = ("/tts", "/set_gpt_weights", "/set_sovits_weights", "/set_refer_audio", "/control",
             "/v1/audio/speech", "/v1/voices", "/metrics", "/health")


def local_path(scope: Mapping[str, Any]) -> str:
    """The request path inside this app (without the prefix it is mounted under, e.g. next to Gradio)."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    return (path[len(root):] or "/") if root and path.startswith(root) else path


def endpoint_label(path: str) -> str:
    if path in ENDPOINTS:
        return path
    if path.startswith("/v1/voices/"):
        return "/v1/voices/{name}"
    return "other"


def status_for(exc: BaseException) -> int:
    """400 for anything the request can fix, 404 unknown voice, 503 busy / out of memory, else 500."""
    from engine.memory import MemoryPressureError
    from studio.http.profiles import ProfileExistsError, ProfileNotFoundError
    from studio.http.runner import ServerBusyError

    if isinstance(exc, (ServerBusyError, MemoryPressureError)):
        return 503
    if isinstance(exc, ProfileNotFoundError):
        return 404
    if isinstance(exc, ProfileExistsError):
        return 409
    if isinstance(exc, EngineError):
        return 400
    return 500


def _param(message: str) -> str | None:
    head = message.split(":", 1)[0].split(" ", 1)[0]
    return head if head.replace("_", "").isalnum() and head.islower() else None


def error_body(exc: BaseException, openai_style: bool) -> dict[str, Any]:
    status = status_for(exc)
    message = str(exc) if status < 500 else f"internal error: {type(exc).__name__}: {exc}"
    if openai_style:
        kind = "invalid_request_error" if status < 500 else "server_error"
        return {"error": {"message": message, "type": kind, "param": _param(message), "code": None}}
    return {"message": message}


def error_response(request: Any, exc: BaseException):
    """A JSON error answer; OpenAI's error shape under ``/v1/``, the api_v2 ``{"message"}`` elsewhere."""
    from fastapi.responses import JSONResponse

    status = status_for(exc)
    if status >= 500 and status != 503:
        log.error("request %s failed", request.url.path, exc_info=exc)
    headers = {"Retry-After": "1"} if status == 503 else None
    return JSONResponse(error_body(exc, local_path(request.scope).startswith("/v1/")), status_code=status,
                        headers=headers)


def describe_validation_error(errors: Iterable[Mapping[str, Any]]) -> str:
    """pydantic errors -> "field: problem; field: problem" (the field first, as every message here)."""
    parts = []
    for e in errors:
        loc = [str(x) for x in e.get("loc", ()) if x not in ("body", "query", "form")]
        parts.append(f"{'.'.join(loc) or 'request'}: {e.get('msg', 'invalid value')}")
    return "; ".join(parts) or "request: invalid"


class BodyLimitMiddleware:
    """Refuses request bodies over ``max_bytes`` with 413 (by Content-Length, or while reading a chunked
    body) and counts every answer in ``sovits_requests_total{endpoint,status}``."""

    def __init__(self, app, max_bytes: int, metrics=None) -> None:
        self.app, self.max_bytes, self.metrics = app, max_bytes, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        endpoint = endpoint_label(local_path(scope))
        status = {"code": 500}

        async def counting_send(message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        def count() -> None:
            if self.metrics is not None:
                self.metrics.requests.inc({"endpoint": endpoint, "status": str(status["code"])})

        length = dict(scope.get("headers") or {}).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._too_large(counting_send, int(length))
            count()
            return
        seen = {"bytes": 0}

        async def limited_receive():
            message = await receive()
            if message["type"] == "http.request":
                seen["bytes"] += len(message.get("body", b""))
                if seen["bytes"] > self.max_bytes:
                    from starlette.exceptions import HTTPException

                    raise HTTPException(413, f"request body: more than {self.max_bytes} bytes; "
                                             f"the limit is {self.max_bytes} (max_upload_bytes)")
            return message

        try:
            await self.app(scope, limited_receive, counting_send)
        finally:
            count()

    async def _too_large(self, send, size: int) -> None:
        import json

        body = json.dumps({"message": f"request body: {size} bytes; the limit is {self.max_bytes} "
                                      f"(max_upload_bytes)"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

