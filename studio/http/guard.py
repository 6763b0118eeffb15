"""The outermost layer of the HTTP app (ASGI): what holds for every request, whatever route it reaches.

Per request, in order: an :class:`~studio.http.exchange.Exchange` with an id (sent back as
``X-Request-Id``); the credentials check (401, counted); the body limit against Content-Length (413
before anything is read) and again while reading, with a read timeout (408), and a JSON body's items
(``,`` and ``:``) against ``max_json_items`` as it arrives (400, before any route's parser); then the app. Anything
the app lets escape becomes a JSON 500 naming the request id (the traceback goes to the log under that
id), or, when the answer has already begun (a stream), a log line and a connection closed before the
end of the chunked body, so the client sees an incomplete answer instead of a short one. Finally the
request is counted by status and by outcome, its work cancelled and its admission released.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from studio.http.errors import endpoint_label, error_json, local_path
from studio.http.origins import origin_refusal
from studio.http.exchange import (
    CANCELLED,
    COMPLETED,
    FAILED,
    FAILED_MID_STREAM,
    INVALID,
    REJECTED_BUSY,
    TIMED_OUT,
    UNAUTHORISED,
    ClientGone,
    Exchange,
)

log = logging.getLogger("studio.http")
CLIENT_CLOSED = 499  # the status label of a request whose client left before the answer (nginx's code)


class BodyTooLarge(Exception):
    """The body went over ``max_upload_bytes`` while being read."""


class BodyTimeout(Exception):
    """The whole body did not arrive within ``body_timeout_s``."""


class SendTimeout(Exception):
    """A synthesis answer could not be handed to a client (it stopped reading) within ``request_timeout_s``, or
    a piece of a stream within ``stream_write_timeout_s``."""


def outcome_of(ex: Exchange, status: int) -> str:
    if ex.outcome is not None:
        return ex.outcome
    if ex.client_gone and not ex.completed:
        return CANCELLED
    if status == 401:
        return UNAUTHORISED
    if status == 503:
        return REJECTED_BUSY
    if status in (408, 504):
        return TIMED_OUT
    if 400 <= status < 500:
        return INVALID
    if status >= 500:
        return FAILED
    return COMPLETED


class Guard:
    """See the module docstring. ``ctx`` is the app's ServerContext; ``api`` the FastAPI app, whose
    non-mounted routes the credentials protect (a mounted app, the web page, has its own login)."""

    def __init__(self, app, ctx, api) -> None:
        self.app, self.ctx, self.api = app, ctx, api

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ex = Exchange(endpoint_label(local_path(scope)), client=str((scope.get("client") or ("",))[0] or ""))
        scope.setdefault("state", {})["exchange"] = ex
        status = {"code": 500, "started": False, "answered": False}  # answered: by the guard, mid-body
        try:
            await self._handle(scope, receive, send, ex, status)
        finally:
            ex.finish()
            self._count(ex, status)

    async def _handle(self, scope, receive, send, ex: Exchange, status: dict) -> None:
        limits = self.ctx.limits
        headers = dict(scope.get("headers") or ())

        streaming = {"yes": False}

        async def send_(message) -> None:
            if status["answered"]:  # the guard refused the body as it arrived: the app's own answer is dropped
                return
            if message["type"] == "http.response.start":
                status["code"], status["started"] = message["status"], True
                message = {**message, "headers": [*message.get("headers", ()), (b"x-request-id", ex.id.encode())]}
            if ex.job is not None and message["type"] == "http.response.body":
                # a client that stops reading blocks this send: the request's time limit holds here too, and a
                # stream's pieces (small, one after another) must each go within the stream write timeout
                streaming["yes"] = streaming["yes"] or message.get("more_body", False)
                timeout = ex.job.remaining()
                if streaming["yes"]:
                    timeout = min(timeout, limits.stream_write_timeout_s)
                try:
                    await asyncio.wait_for(send(message), max(timeout, 0.001))
                except TimeoutError:
                    ex.outcome = TIMED_OUT
                    raise SendTimeout() from None
            else:
                await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                ex.completed = True

        refused = header_refusal(scope, limits)
        if refused is not None:
            await self._reject(send_, ex, scope, *refused, [(b"connection", b"close")])
            return
        if not self.ctx.access.api_keys:  # no key: only this machine's names, never a page on another site
            why = origin_refusal(headers, self.ctx.settings.allowed_hosts)
            if why is not None:
                await self._reject(send_, ex, scope, 403, why)
                return
        if self.ctx.access.required and self._protected(scope) and not self.ctx.access.allows(headers):
            await self._reject(send_, ex, scope, 401, "authentication required: " + self._how(),
                               [(b"www-authenticate", self.ctx.access.challenge.encode())])
            return
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > limits.max_upload_bytes:
            await self._reject(send_, ex, scope, 413, f"request body: {int(length)} bytes; the limit is "
                                                      f"{limits.max_upload_bytes} (max_upload_bytes)")
            return
        if not _has_body(headers):
            ex.body_complete()
        async def refuse_json() -> None:  # any route's parser (the page's too) would hold the GIL for seconds
            if not status["started"]:
                limit = limits.max_json_items
                await self._reject(send_, ex, scope, 400, f"request body: JSON with more than {limit} ',' and ':' "
                                                          "separators (max_json_items); send the named fields only",
                                   [(b"connection", b"close")])
            status["answered"] = True

        json_body = b"json" in headers.get(b"content-type", b"").lower()  # application/json, */*+json
        receive_ = self._limited(receive, ex, refuse_json if json_body else None)
        try:
            await self.app(scope, receive_, send_)
        except BodyTooLarge:  # the rest of the body is not read: the connection closes after the answer
            limit = limits.max_upload_bytes
            await self._reject(send_, ex, scope, 413, f"request body: more than {limit} bytes; the limit is {limit} "
                                                      f"(max_upload_bytes)", [(b"connection", b"close")])
        except BodyTimeout:
            await self._reject(send_, ex, scope, 408, f"request body: not complete after {limits.body_timeout_s:g} s "
                                                      f"(body_timeout_s); send the whole body within it",
                               [(b"connection", b"close")])
        except Exception as exc:  # noqa: BLE001 - the last place an error can be turned into an answer
            if _holds(exc, SendTimeout):  # the answer had begun: the connection is closed before its end
                log.warning("request %s: the client stopped reading; the answer was cut (request_timeout_s, or "
                            "stream_write_timeout_s for a stream)", ex.id)
                return
            if _client_left(exc) or ex.client_gone:
                ex.client_gone = True
                if not status["started"]:
                    status["code"] = CLIENT_CLOSED
                return
            if status["started"]:
                ex.outcome = ex.outcome or FAILED_MID_STREAM
                log.error("request %s: %s failed after its answer began; the stream was cut", ex.id,
                          local_path(scope), exc_info=exc)
                return  # the server closes the connection before the chunked body's end: the client sees it
            log.error("request %s: %s failed", ex.id, local_path(scope), exc_info=exc)
            await self._reject(send_, ex, scope, 500, f"internal error (request id {ex.id}); the server log "
                                                      f"has the details")

    def _limited(self, receive, ex: Exchange, refuse_json=None):
        """``receive`` within the body limits. ``refuse_json``: for a JSON body, answers it 400 when it holds more
        items than ``max_json_items``; the app then reads a disconnect (whatever route or mounted app it is, it
        stops before parsing, and its own answer is dropped)."""
        limits = self.ctx.limits
        seen = {"bytes": 0, "done": False, "items": 0, "refused": False}
        deadline = time.monotonic() + limits.body_timeout_s  # the whole body, not each piece

        async def receive_() -> dict[str, Any]:
            if seen["refused"]:
                return {"type": "http.disconnect"}
            if seen["done"]:
                message = await receive()
            else:
                try:
                    message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.001))
                except TimeoutError:
                    raise BodyTimeout() from None
            if message["type"] == "http.disconnect":
                ex.client_gone = True
            elif message["type"] == "http.request":
                piece = message.get("body", b"")
                seen["bytes"] += len(piece)
                seen["done"] = not message.get("more_body", False)
                if seen["bytes"] > limits.max_upload_bytes:
                    raise BodyTooLarge()
                if refuse_json is not None:
                    seen["items"] += piece.count(b",") + piece.count(b":")
                    if seen["items"] > limits.max_json_items:
                        seen["refused"] = True
                        await refuse_json()
                        return {"type": "http.disconnect"}
                if seen["done"]:
                    ex.body_complete()
            return message

        return receive_

    def _protected(self, scope) -> bool:
        """Every route of the API, and any path no route takes; not a mounted app (it has its own login)."""
        from starlette.routing import Match, Mount

        mounted = False
        for route in self.api.routes:
            match = route.matches(scope)[0]
            if match == Match.NONE:
                continue
            if not isinstance(route, Mount):
                return True
            mounted = True
        return not mounted

    def _how(self) -> str:
        if self.ctx.access.api_keys:
            return "send the API key as 'Authorization: Bearer <key>' or 'X-API-Key: <key>'"
        return "log in with HTTP Basic (the --auth credentials)"

    async def _reject(self, send, ex: Exchange, scope, status: int, message: str,
                      headers: list[tuple[bytes, bytes]] | None = None) -> None:
        body = json.dumps(error_json(scope, status, message, ex.id)).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                *(headers or ())]})
        await send({"type": "http.response.body", "body": body})

    def _count(self, ex: Exchange, status: dict) -> None:
        metrics = self.ctx.metrics
        code = status["code"]
        if ex.client_gone and not status["started"]:
            code = CLIENT_CLOSED
        outcome = outcome_of(ex, code)
        metrics.requests.inc({"endpoint": ex.endpoint, "status": str(code)})
        metrics.outcomes.inc({"endpoint": ex.endpoint, "outcome": outcome})
        if outcome == COMPLETED and ex.audio_seconds:
            metrics.audio_seconds.inc(amount=ex.audio_seconds)


def header_refusal(scope, limits) -> tuple[int, str] | None:
    """(status, message) when the request line or the headers are over the limits (414 / 431), else None."""
    target = len(scope.get("raw_path") or scope.get("path", "").encode()) + len(scope.get("query_string") or b"")
    if target > limits.max_header_line_bytes:
        return 414, (f"request line: the URL is {target} bytes; the limit is {limits.max_header_line_bytes} "
                     "(max_header_line_bytes); send long values in a POST body")
    raw = scope.get("headers") or ()
    if len(raw) > limits.max_headers:
        return 431, f"request headers: {len(raw)} lines; the limit is {limits.max_headers} (max_headers)"
    total = 0
    for name, value in raw:
        line = len(name) + len(value) + 4  # "name: value\r\n"
        if line > limits.max_header_line_bytes:
            return 431, (f"request headers: the {name.decode('latin-1')[:64]!r} line is {line} bytes; the limit is "
                         f"{limits.max_header_line_bytes} (max_header_line_bytes)")
        total += line
    if total > limits.max_header_bytes:
        return 431, f"request headers: {total} bytes; the limit is {limits.max_header_bytes} (max_header_bytes)"
    return None


def _has_body(headers: dict[bytes, bytes]) -> bool:
    """Whether a body follows the head (h11's rule: a Content-Length above 0, or chunked transfer)."""
    length = headers.get(b"content-length", b"0").strip()
    return b"transfer-encoding" in headers or not length.isdigit() or int(length) > 0


def _holds(exc: BaseException, kind: type) -> bool:
    """``exc`` is a ``kind``, or an exception group (a task group's) holding one."""
    if isinstance(exc, kind):
        return True
    # an exception group: Python 3.11's, or on 3.10 the exceptiongroup backport anyio raises (no builtin there)
    inner = getattr(exc, "exceptions", None)
    return isinstance(inner, (tuple, list)) and any(isinstance(e, BaseException) and _holds(e, kind) for e in inner)


def _client_left(exc: BaseException) -> bool:
    from starlette.requests import ClientDisconnect

    return isinstance(exc, (ClientGone, ClientDisconnect))
