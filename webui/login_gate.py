"""Under ``--auth``, the page's routes that Gradio serves without its login need it too.

Gradio checks the login on its queue and call routes but not on the heartbeat stream
(``/gradio_api/heartbeat/{session}``), which holds a connection open for as long as the client likes: an
anonymous client could open hundreds and starve logged-in users. :class:`PageLoginGate` (ASGI) answers
401 to such a request unless it carries the cookie of a session Gradio logged in.
"""

from __future__ import annotations

import json
from http.cookies import CookieError, SimpleCookie

GATED = ("/heartbeat/",)  # path parts of the Gradio routes that skip Gradio's own login check


class PageLoginGate:
    """ASGI middleware; ``page`` is Gradio's app (its ``tokens`` and ``cookie_id`` say who logged in)."""

    def __init__(self, app, page) -> None:
        self.app, self.page = app, page

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and any(part in scope.get("path", "") for part in GATED) \
                and not self.logged_in(scope):
            body = json.dumps({"message": "log in to the page first (the page was started with --auth)"}).encode()
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)

    def logged_in(self, scope) -> bool:
        cookies = SimpleCookie()
        for name, value in scope.get("headers") or ():
            if name == b"cookie":
                try:
                    cookies.load(value.decode("latin-1"))
                except CookieError:
                    return False
        cookie_id = getattr(self.page, "cookie_id", "")
        tokens = getattr(self.page, "tokens", {}) or {}
        for key in (f"access-token-{cookie_id}", f"access-token-unsecure-{cookie_id}"):
            if key in cookies and cookies[key].value in tokens:
                return True
        return False
