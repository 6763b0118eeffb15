"""One HTTP request carried between processes, and run through an ASGI app in this process.

The gateway packs what it received into a :class:`ForwardedRequest` (a picklable value); a replica
runs it through the server's own FastAPI app with :func:`serve_forwarded` and hands back the ASGI
messages one by one (the response start, then body chunks), so streaming answers stay streamed and
every route, check and error message is the app's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

Headers = tuple[tuple[bytes, bytes], ...]


@dataclass(frozen=True)
class ForwardedRequest:
    """An HTTP request as the gateway received it (the whole body: its size is capped there)."""

    method: str
    path: str
    query_string: bytes = b""
    headers: Headers = ()
    body: bytes = b""
    client: tuple[str, int] | None = None

    def header(self, name: bytes) -> bytes | None:
        """The first value of header ``name`` (lower case, as ASGI names headers)."""
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    def scope(self) -> dict[str, Any]:
        return {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": self.method, "scheme": "http", "path": self.path, "raw_path": self.path.encode(),
            "query_string": self.query_string, "root_path": "", "headers": list(self.headers),
            "client": self.client, "server": ("127.0.0.1", 80), "state": {},
        }


@dataclass(frozen=True)
class ResponseStart:
    """The status line and headers of a response (ASGI ``http.response.start``)."""

    status: int
    headers: Headers = field(default=())


async def serve_forwarded(app: Callable, request: ForwardedRequest, max_pending: int = 8
                          ) -> AsyncIterator[ResponseStart | bytes]:
    """Run ``request`` through the ASGI ``app``; yields one :class:`ResponseStart`, then body chunks.

    At most ``max_pending`` messages wait for the consumer (the app's ``send`` waits beyond that, so a
    slow client slows the synthesis, as it does on a direct connection). Closing the iterator early
    tells the app the client is gone (``http.disconnect``), which stops a streamed synthesis.
    """
    messages: asyncio.Queue = asyncio.Queue(maxsize=max_pending)
    gone = asyncio.Event()
    body_read = False

    async def receive() -> dict[str, Any]:
        nonlocal body_read
        if not body_read:
            body_read = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        await messages.put(message)

    async def run() -> None:
        try:
            await app(request.scope(), receive, send)
        finally:
            await messages.put(None)  # the app is done (or failed)

    task = asyncio.create_task(run())
    started = False
    try:
        while True:
            message = await messages.get()
            if message is None:
                break
            if message["type"] == "http.response.start":
                started = True
                yield ResponseStart(message["status"], tuple(
                    (bytes(k), bytes(v)) for k, v in message.get("headers", ())))
            elif message["type"] == "http.response.body":
                chunk = message.get("body", b"")
                if chunk:
                    yield bytes(chunk)
                if not message.get("more_body", False):
                    break
        if not started:  # the app ended without answering (it raised before its error handlers)
            error = task.exception() if task.done() and not task.cancelled() else None
            log.error("the app gave no response to %s %s", request.method, request.path, exc_info=error)
            yield ResponseStart(500, ((b"content-type", b"application/json"),))
            yield b'{"message": "internal error: the server gave no response"}'
    finally:
        gone.set()
        if not task.done():
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(task), timeout=5.0)
        if not task.done():
            task.cancel()
        elif not task.cancelled() and task.exception() is not None and started:
            log.debug("the app raised after answering", exc_info=task.exception())
