"""Errors as HTTP answers: the status of each error type, the client's words for the field at fault, and
bodies that never carry reprs, addresses or a library's exception text.

Engine errors name their input with the engine's words (``EngineError.field``); a route puts its own
parameter names in ``Exchange.names`` (api_v2: ``reference.audio`` -> ``ref_audio_path``...), and the
message the client reads starts with that name. An error raised from a library exception (``raise ...
from e``) may hold that library's text, so its body says what failed in our words only and gives the
request id; the full message goes to the log under that id. api_v2 routes answer ``{"message": ...}``,
the OpenAI routes (``/v1/...``) ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from engine.errors import (
    BusyError,
    CheckpointError,
    EngineError,
    OptionsError,
    ReferenceAudioError,
    TextError,
    UnsupportedLanguageError,
)

log = logging.getLogger("studio.http")

# endpoints named in metrics (anything else is "other", so clients cannot blow up label cardinality)
ENDPOINTS = ("/tts", "/set_gpt_weights", "/set_sovits_weights", "/set_refer_audio", "/control",
             "/v1/audio/speech", "/v1/voices", "/metrics", "/health")

# what a client reads instead of a message that may carry a library's text
_PLAIN = ((ReferenceAudioError, "the clip cannot be decoded as audio; use a wav, flac, ogg or mp3 file"),
          (CheckpointError, "the weight file cannot be loaded (missing, corrupt, unsafe or of the wrong kind)"),
          (TextError, "the text cannot be read"),
          (UnsupportedLanguageError, "the language is not supported"))


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
    """400 for anything the request can fix, 404 unknown voice, 409 voice exists, 503 busy or out of
    memory, 504 over the time limit, else 500."""
    from engine.memory import MemoryPressureError
    from studio.http.exchange import RequestTimeoutError
    from studio.http.profiles import ProfileExistsError, ProfileNotFoundError

    if isinstance(exc, (BusyError, MemoryPressureError)) or _is_runner_busy(exc):
        return 503
    if isinstance(exc, RequestTimeoutError):
        return 504
    if isinstance(exc, ProfileNotFoundError):
        return 404
    if isinstance(exc, ProfileExistsError):
        return 409
    if isinstance(exc, EngineError):
        return 400
    return 500


def _is_runner_busy(exc: BaseException) -> bool:
    try:  # the worker pool's own busy error, while it has one
        from studio.http.runner import ServerBusyError
    except ImportError:
        return False
    return isinstance(exc, ServerBusyError)


def retry_after(exc: BaseException, default: float) -> float:
    return float(getattr(exc, "retry_after", default))


def param_name(field: str | None, names: Mapping[str, str]) -> str | None:
    """The route's name for an engine field; ``reference.aux_audio[2]`` maps through ``reference.aux_audio``."""
    if field is None:
        return None
    if field in names:
        return names[field]
    base, bracket, index = field.partition("[")
    if bracket and base in names:
        return f"{names[base]}[{index}"
    return field


def server_folders(request: Any) -> tuple[str, ...]:
    """The folders a message must not name: the working folder, the reference and weight folders."""
    import os

    ctx = getattr(getattr(getattr(request, "app", None), "state", None), "context", None)
    folders = [os.getcwd()]
    if ctx is not None:
        folders += [str(r) for r in ctx.reference_roots] + [str(r) for r in ctx.weight_roots]
    return tuple(f for f in folders if len(f) > 1)


def without_folders(message: str, folders: Iterable[str]) -> str:
    """``message`` with every server folder cut from the paths in it (``/srv/refs/a.wav`` -> ``a.wav``)."""
    import os

    for folder in sorted(set(folders), key=len, reverse=True):
        message = message.replace(folder.rstrip(os.sep) + os.sep, "")
    return message


def client_message(exc: EngineError, names: Mapping[str, str], request_id: str,
                   folders: Iterable[str] = ()) -> tuple[str, str | None]:
    """(message, param) for the client: the route's parameter name first, never library text nor a server
    folder."""
    field = exc.field
    param = param_name(field, names)
    message = without_folders(str(exc), folders)
    cause = exc.__cause__
    if cause is not None and not isinstance(cause, EngineError):
        plain = next((text for cls, text in _PLAIN if isinstance(exc, cls)), "invalid value")
        log.warning("request %s: %s", request_id, message)
        message = f"{plain} (request id {request_id})"
    return _with_param(message, field, param), param if param is not None else _leading_name(message)


def _with_param(message: str, field: str | None, param: str | None) -> str:
    """``message`` led by ``param``: "field: x" and "field is x" take the route's name in the field's place."""
    if param is None:
        return message
    for name in dict.fromkeys(n for n in (field, param) if n):
        if message.startswith(name + ":"):
            return f"{param}: {message[len(name) + 1:].lstrip()}"
        if message.startswith(name + " "):
            return param + message[len(name):]
    return f"{param}: {message}"


def _leading_name(message: str) -> str | None:
    head = message.split(":", 1)[0].split(" ", 1)[0]
    return head if head.replace("_", "").isalnum() and head.islower() else None


def error_json(scope: Mapping[str, Any], status: int, message: str, request_id: str,
               param: str | None = None) -> dict[str, Any]:
    """The body of an error answer (api_v2 or OpenAI shape by path), with the request id."""
    if local_path(scope).startswith("/v1/"):
        kind = "invalid_request_error" if status < 500 else "server_error"
        return {"error": {"message": message, "type": kind, "param": param, "code": None,
                          "request_id": request_id}}
    return {"message": message, "request_id": request_id}


def error_response(request: Any, exc: BaseException, default_retry_after: float = 1.0):
    """The JSON answer to an error a route raised (engine errors and HTTP errors; the guard answers the rest)."""
    from fastapi.responses import JSONResponse

    from studio.http.exchange import REJECTED_BUSY

    ex = request.scope.get("state", {}).get("exchange")
    request_id = ex.id if ex is not None else "-"
    status = status_for(exc)
    headers = None
    if isinstance(exc, EngineError):
        message, param = client_message(exc, ex.names if ex is not None else {}, request_id, server_folders(request))
    else:
        message, param = f"internal error (request id {request_id}); the server log has the details", None
        log.error("request %s failed", request_id, exc_info=exc)
    if status == 503:
        headers = {"Retry-After": str(max(1, round(retry_after(exc, default_retry_after))))}
        if ex is not None:
            ex.outcome = REJECTED_BUSY
    return JSONResponse(error_json(request.scope, status, message, request_id, param), status_code=status,
                        headers=headers)


def describe_validation_error(errors: Iterable[Mapping[str, Any]]) -> tuple[str, str | None]:
    """pydantic errors -> ("field: problem; field: problem", the first field)."""
    parts, first = [], None
    for e in errors:
        loc = [str(x) for x in e.get("loc", ()) if x not in ("body", "query", "form")]
        name = ".".join(loc) or "request"
        first = first or name
        parts.append(f"{name}: {e.get('msg', 'invalid value')}")
    return "; ".join(parts) or "request: invalid", first


def validation_error(errors: Iterable[Mapping[str, Any]]) -> OptionsError:
    message, first = describe_validation_error(errors)
    return OptionsError(message, field=first)
