"""The page and the HTTP API of :mod:`studio.http` as one app, on one port.

``create_webui_app`` mounts the Gradio page at ``/`` of the API's FastAPI app (the API routes keep
their official paths: ``/tts``, ``/v1/audio/speech``, ``/metrics``...). With ``--auth`` credentials the page
asks for a login and the API routes for HTTP Basic. Page and API run their syntheses on one bounded pool of
workers (the API's ``SynthesisRunner``). The command that serves it is ``sovits-studio webui``
(:mod:`studio.cli.webui`).
"""

from __future__ import annotations

import base64
import binascii
import hmac
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import ConfigError

if TYPE_CHECKING:
    from fastapi import FastAPI

MIB = 1 << 20
MULTIPART_SLACK = 1 * MIB  # the body limit leaves room for the form around a file of the maximum size
Credentials = list[tuple[str, str]]


def parse_auth(value: str) -> Credentials:
    """``USER:PASS``, or a file with one ``USER:PASS`` per line (blank lines and ``#`` comments skipped)."""
    path = Path(value)
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else [value]
    pairs = []
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, password = line.partition(":")
        if not sep or not user or not password:
            where = f"{path}:{n}" if path.is_file() else "--auth"
            raise ConfigError(f"{where}: expected USER:PASS (both non-empty)")
        pairs.append((user, password))
    if not pairs:
        raise ConfigError(f"--auth file {path} holds no USER:PASS line")
    return pairs


class ApiBasicAuth:
    """HTTP Basic on the API routes of ``app`` (the mounted page has its own login); other paths pass."""

    def __init__(self, app, api, credentials: Credentials) -> None:
        self.app, self.api, self.credentials = app, api, credentials

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and self._is_api(scope) and not self._authorized(scope):
            body = b'{"message": "authentication required (HTTP Basic, the --auth credentials)"}'
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Basic"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)

    def _is_api(self, scope) -> bool:
        from starlette.routing import Match, Mount

        return any(not isinstance(r, Mount) and r.matches(scope)[0] != Match.NONE for r in self.api.routes)

    def _authorized(self, scope) -> bool:
        header = dict(scope.get("headers") or {}).get(b"authorization", b"")
        if not header.lower().startswith(b"basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:].strip()).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        return any(hmac.compare_digest(user, u) & hmac.compare_digest(password, p) for u, p in self.credentials)


def create_webui_app(studio, config=None, ui_settings=None, server_settings=None, auth: Credentials | None = None,
                     concurrency: int | None = None, max_queue: int | None = None,
                     catalog=None) -> FastAPI:
    """The API app of ``studio`` with the page mounted at ``/``."""
    from dataclasses import replace

    import gradio as gr

    from studio.http.app import create_app
    from studio.http.context import ServerSettings
    from webui.app import ASSETS, UISettings, build_ui, page_i18n, page_theme

    server_settings = server_settings or ServerSettings()
    upload = server_settings.max_upload_bytes
    app = create_app(studio, replace(server_settings, max_upload_bytes=upload + MULTIPART_SLACK))
    demo = build_ui(studio, config=config, catalog=catalog, settings=ui_settings or UISettings(),
                    pool=app.state.context.runner,  # page and API share the synthesis workers
                    super_sampler=app.state.context.super_sampler)
    workers = concurrency or server_settings.workers
    waiting = server_settings.max_queue if max_queue is None else max_queue
    # gradio's queue holds the running requests too (its max_size 0 would refuse every one): the pool's
    # workers plus its queue; the pool itself answers "busy" when the HTTP API has taken the room
    demo.queue(default_concurrency_limit=workers, max_size=workers + waiting)
    if auth:
        app.add_middleware(ApiBasicAuth, api=app, credentials=auth)
    return gr.mount_gradio_app(app, demo, path="/", auth=auth or None, max_file_size=upload,
                               allowed_paths=[str(ASSETS)], show_error=True, theme=page_theme(), i18n=page_i18n())
