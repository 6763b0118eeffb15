"""The page and the HTTP API of :mod:`studio.http` as one app, on one port.

``create_webui_app`` mounts the Gradio page at ``/`` of the API's FastAPI app (the API routes keep
their official paths: ``/tts``, ``/v1/audio/speech``, ``/metrics``...). With ``--auth`` credentials the page
asks for a login and the API routes for HTTP Basic. Page and API run their syntheses on one bounded pool of
workers (the API's ``SynthesisRunner``). The command that serves it is ``sovits-studio webui``
(:mod:`studio.cli.webui`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

Credentials = list[tuple[str, str]]
TEMP_ENV = "GRADIO_TEMP_DIR"  # where Gradio keeps the files a page serves (uploads, clips, example copies)


@contextmanager
def own_file_folder() -> Iterator[Path]:
    """A fresh folder for every file this process's page serves, removed when the block ends.

    Gradio keeps uploads, results and copies of the example clips in one machine-wide folder
    (``$GRADIO_TEMP_DIR``, default ``/tmp/gradio``), named by content, and each app deletes "its" files when
    it stops: another instance that stops (or fails on its port) takes this one's example clips with it.
    Inside the block, this process's Gradio works in a folder of its own (made inside ``$GRADIO_TEMP_DIR``
    when that is set), so nothing another process does can delete its files. Gradio reads the variable
    when a page is built and on each upload, so the block must hold both; a process serves one page in it.
    """
    parent = os.environ.get(TEMP_ENV) or None
    if parent:
        Path(parent).mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="sovits-studio-webui-", dir=parent)).resolve()
    before = os.environ.get(TEMP_ENV)
    os.environ[TEMP_ENV] = str(folder)
    try:
        yield folder
    finally:
        if before is None:
            os.environ.pop(TEMP_ENV, None)
        else:
            os.environ[TEMP_ENV] = before
        shutil.rmtree(folder, ignore_errors=True)


def parse_auth(value: str) -> Credentials:
    """``USER:PASS``, or a file with one ``USER:PASS`` per line (see :func:`studio.http.auth.parse_logins`)."""
    from studio.http.auth import parse_logins

    return list(parse_logins(value))


def create_webui_app(studio, config=None, ui_settings=None, server_settings=None, auth: Credentials | None = None,
                     concurrency: int | None = None, max_queue: int | None = None,
                     catalog=None) -> FastAPI:
    """The API app of ``studio`` with the page mounted at ``/``."""
    from dataclasses import replace

    import gradio as gr

    from studio.http.app import create_app
    from studio.http.auth import Access
    from studio.http.context import ServerSettings
    from webui.app import ASSETS, UISettings, build_ui, page_i18n, page_theme

    server_settings = server_settings or ServerSettings()
    if auth:  # the API routes take the page's logins as HTTP Basic (the guard checks and counts them)
        server_settings = replace(server_settings, access=Access(logins=tuple(auth)))
    limits = server_settings.limits
    upload = limits.max_upload_bytes  # one limit for the whole body, API and page alike
    app = create_app(studio, server_settings)
    ui_settings = replace(ui_settings or UISettings(), request_timeout_s=limits.request_timeout_s)
    demo = build_ui(studio, config=config, catalog=catalog, settings=ui_settings,
                    pool=app.state.context.runner,  # page and API share the synthesis workers
                    super_sampler=app.state.context.super_sampler)
    workers = concurrency or limits.workers
    waiting = (limits.max_inflight - limits.workers) if max_queue is None else max_queue
    # gradio's queue holds the running requests too (its max_size 0 would refuse every one): the pool's
    # workers plus its queue; the pool itself answers "busy" when the HTTP API has taken the room
    demo.queue(default_concurrency_limit=workers, max_size=workers + waiting)
    app = gr.mount_gradio_app(app, demo, path="/", auth=auth or None, max_file_size=upload,
                              allowed_paths=[str(ASSETS)], show_error=True, theme=page_theme(), i18n=page_i18n())
    from webui.upload_quota import MAX_BYTES_PER_UPLOAD_LIMIT, UploadQuota

    app.add_middleware(UploadQuota, folder=demo.GRADIO_CACHE, max_bytes=MAX_BYTES_PER_UPLOAD_LIMIT * upload,
                       per_upload=upload)
    if auth:  # before login: no API description on the login form, and Gradio's heartbeat behind the login
        from webui.login_gate import PageLoginGate

        page = _mounted_page(app)
        app.add_middleware(PageLoginGate, page=page)
        app.add_middleware(LoginPageGuard, page=page)
    return app


def _mounted_page(app):
    """The Gradio app mounted at ``/`` of ``app``."""
    from gradio.routes import App

    return next(route.app for route in app.routes if isinstance(getattr(route, "app", None), App))


class LoginPageGuard:
    """Before login, ``/`` is Gradio's login form, into which Gradio writes its API description (every
    endpoint, parameter and default) although ``/gradio_api/info`` itself asks for the login. This ASGI
    middleware answers ``GET /`` of a visitor without a login session with the same form and no API
    description; a logged-in visitor gets the page as Gradio serves it."""

    def __init__(self, app, page) -> None:
        self.app = app
        self.page = page  # the mounted gradio.routes.App: its login sessions and its page

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] in ("GET", "HEAD") and scope["path"] == "/":
            from starlette.requests import Request

            request = Request(scope)
            if not self._logged_in(request):
                await self._login_form(request)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _logged_in(self, request) -> bool:
        cookie_id = self.page.cookie_id
        token = (request.cookies.get(f"access-token-{cookie_id}")
                 or request.cookies.get(f"access-token-unsecure-{cookie_id}"))
        return token is not None and self.page.tokens.get(token) is not None

    def _login_form(self, request):
        from gradio import route_utils
        from gradio.routes import templates

        blocks = self.page.get_blocks()
        root = route_utils.get_root_url(request=request, route_path="/",
                                        root_path=self.page.root_path or request.scope.get("root_path")
                                        or blocks.custom_mount_path)
        config = {"auth_required": True, "auth_message": blocks.auth_message, "space_id": blocks.space_id,
                  "root": root, "page": {"": {"layout": {}}}, "pages": [""], "components": [], "dependencies": [],
                  "current_page": ""}  # what gradio.routes serves a visitor without a login, less the API
        return templates.TemplateResponse(request=request, name="frontend/index.html",
                                          context={"base_url": "./", "config": config, "gradio_api_info": {}},
                                          headers={"Cache-Control": "no-store"})
