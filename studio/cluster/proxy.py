"""A middleware for Serve's HTTP proxy: a request whose gateway stopped before answering gets 503 with
``Retry-After`` (the answer of a request whose replica stopped), not the proxy's bare 500.

Serve's proxy answers nothing itself when the ingress actor dies under a request (it only answers 408 and
503 on its own); uvicorn then sends a plain-text 500. This middleware sits in the proxy process (passed
in ``http_options.middlewares`` by ``sovits-studio cluster``; with ``serve deploy``, set
``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=studio.cluster.proxy:proxy_middlewares`` on ``ray start``),
sees that no response was started, and sends the 503. A response already streaming cannot change its
status: its connection ends early, which the client sees as an incomplete body.
"""

from __future__ import annotations

import logging
from typing import Any

from studio.cluster.failures import unavailable_body, unavailable_headers

log = logging.getLogger(__name__)
GATEWAY_LOST = "the gateway handling this request stopped; the cluster is replacing it: send the request again"


class AnswerLostRequests:
    """Pure ASGI middleware (Starlette's ``Middleware(AnswerLostRequests)``)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        started = False
        gone = False

        async def tracking_send(message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        async def tracking_receive():
            nonlocal gone
            message = await receive()
            if message["type"] == "http.disconnect":
                gone = True
            return message

        await self.app(scope, tracking_receive, tracking_send)
        if not started and not gone:
            path = scope.get("path", "")
            log.warning("%s %s: the ingress gave no answer (its gateway stopped?); answering 503",
                        scope.get("method"), path)
            await send({"type": "http.response.start", "status": 503, "headers": unavailable_headers()})
            await send({"type": "http.response.body", "body": unavailable_body(path, GATEWAY_LOST)})


def proxy_middlewares() -> list:
    """The middlewares of Serve's HTTP proxy (also usable as ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH``)."""
    from starlette.middleware import Middleware

    return [Middleware(AnswerLostRequests)]
