"""The page and the HTTP API of :mod:`studio.http` as one app, on one port.

``create_webui_app`` mounts the Gradio page at ``/`` of the API's FastAPI app (the API routes keep
their official paths: ``/tts``, ``/v1/audio/speech``, ``/metrics``...). With ``--auth`` credentials the page
asks for a login and the API routes for HTTP Basic. Page and API run their syntheses on one bounded pool of
workers (the API's ``SynthesisRunner``). The command that serves it is ``sovits-studio webui``
(:mod:`studio.cli.webui`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

Credentials = list[tuple[str, str]]


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
    waiting = limits.max_queue if max_queue is None else max_queue
    # gradio's queue holds the running requests too (its max_size 0 would refuse every one): the pool's
    # workers plus its queue; the pool itself answers "busy" when the HTTP API has taken the room
    demo.queue(default_concurrency_limit=workers, max_size=workers + waiting)
    app = gr.mount_gradio_app(app, demo, path="/", auth=auth or None, max_file_size=upload,
                              allowed_paths=[str(ASSETS)], show_error=True, theme=page_theme(), i18n=page_i18n())
    from webui.upload_quota import MAX_BYTES_PER_UPLOAD_LIMIT, UploadQuota

    app.add_middleware(UploadQuota, folder=demo.GRADIO_CACHE, max_bytes=MAX_BYTES_PER_UPLOAD_LIMIT * upload)
    if auth:  # Gradio's heartbeat stream skips its login: the page's login covers it here
        from starlette.routing import Mount

        from webui.login_gate import PageLoginGate

        page = next(r.app for r in app.routes if isinstance(r, Mount) and r.path in ("", "/"))
        app.add_middleware(PageLoginGate, page=page)
    return app
