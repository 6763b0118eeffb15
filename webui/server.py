"""``sovits-studio webui``: the page and the HTTP API of :mod:`engine.server` in one process, on one port.

``create_webui_app`` mounts the Gradio page at ``/`` of the API's FastAPI app (the API routes keep
their official paths: ``/tts``, ``/v1/audio/speech``, ``/metrics``...). ``serve`` loads the config,
builds the studio (models load on first use), runs uvicorn and, with ``--share``, opens Gradio's
public tunnel to it. With ``--auth`` the page asks for a login and the API routes for HTTP Basic. Page and
API run their syntheses on one bounded pool of workers (the API's ``SynthesisRunner``).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hmac
import os
import sys
import threading
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
                     concurrency: int = 1, max_queue: int = 32, catalog=None) -> FastAPI:
    """The API app of ``studio`` with the page mounted at ``/``."""
    from dataclasses import replace

    import gradio as gr

    from engine.server.app import ServerSettings, create_app
    from webui.app import ASSETS, UISettings, build_ui

    server_settings = server_settings or ServerSettings()
    upload = server_settings.max_upload_bytes
    app = create_app(studio, replace(server_settings, max_upload_bytes=upload + MULTIPART_SLACK))
    demo = build_ui(studio, config=config, catalog=catalog, settings=ui_settings or UISettings(),
                    pool=app.state.context.runner)  # page and API share the synthesis workers
    demo.queue(default_concurrency_limit=concurrency, max_size=max_queue)
    if auth:
        app.add_middleware(ApiBasicAuth, api=app, credentials=auth)
    return gr.mount_gradio_app(app, demo, path="/", auth=auth or None, max_file_size=upload,
                               allowed_paths=[str(ASSETS)], show_error=True)


# ---- the command -------------------------------------------------------------------------------


def _studio(config, args: argparse.Namespace, weight_roots: tuple[str, ...]):
    """The Studio, and a notice when the config's device is not on this machine (then: auto)."""
    from engine.options import EngineSettings
    from engine.pipeline import Studio

    engine_settings = EngineSettings(weight_roots=weight_roots, max_text_chars=args.max_text_chars)
    studio = Studio.from_config(config, device=args.device, precision=args.precision, settings=engine_settings)
    if studio.device_notice:
        print(f"warning: {studio.device_notice}", file=sys.stderr)
    return studio, studio.device_notice[:1].upper() + studio.device_notice[1:]


def serve(args: argparse.Namespace) -> int:
    import logging

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from engine.config import load_config
    from engine.server.app import ServerSettings
    from webui.app import UISettings
    from webui.models_list import ModelCatalog

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    auth = parse_auth(args.auth) if args.auth else None
    config = load_config(args.config)
    catalog = ModelCatalog(config.base_dir, extra_dirs=tuple(
        config.path(k).parent for k in ("t2s_weights_path", "vits_weights_path")))
    roots = tuple(str(d) for d in catalog.folders)
    studio, notice = _studio(config, args, roots)
    server_settings = ServerSettings(weight_roots=roots, profiles_dir=args.profiles_dir,
                                     max_upload_bytes=int(args.max_upload_mb * MIB), workers=args.workers,
                                     max_tokens_per_sentence=args.max_tokens_per_sentence)
    ui = UISettings(max_tokens_per_sentence=args.max_tokens_per_sentence, notice=notice)
    print("listing weight files...", file=sys.stderr)
    app = create_webui_app(studio, config, ui, server_settings, auth, concurrency=args.workers,
                           max_queue=args.max_queue, catalog=catalog)
    return _run(app, args.host, args.port, share=args.share, protected=bool(auth))


def _run(app, host: str, port: int, share: bool, protected: bool) -> int:
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                           timeout_graceful_shutdown=5))  # open page streams do not block Ctrl+C
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            print(f"error: the server could not start on {host}:{port} (port in use?)", file=sys.stderr)
            return 1
        thread.join(0.1)
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    print(f"SoVITS Studio is running: http://{shown}:{port}/  (HTTP API on the same port: /tts, "
          f"/v1/audio/speech, /docs)", flush=True)
    if share:
        print(_share_link("127.0.0.1", port, protected), flush=True)
    try:
        while thread.is_alive():
            thread.join(0.5)
    except KeyboardInterrupt:
        server.should_exit = True
        thread.join(10)
    return 0


def _share_link(host: str, port: int, protected: bool) -> str:
    """Open Gradio's share tunnel to the local server; the public URL, or why there is none."""
    import secrets

    from gradio.networking import setup_tunnel

    try:
        url = setup_tunnel(host, port, secrets.token_urlsafe(32), None, None)
    except Exception as e:  # noqa: BLE001 - any failure here only means "no public link"
        return f"warning: no share link ({type(e).__name__}: {e}); the page is still served locally"
    warning = "" if protected else "  (anyone with the link can use it: add --auth USER:PASS)"
    return f"Public link (72 h): {url}{warning}"
