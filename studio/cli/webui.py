"""`sovits-studio webui`: the web page and the HTTP API on one port (the README's main command)."""

from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from studio.cli.bootstrap import (
        add_config_argument,
        add_device_arguments,
        add_knob_arguments,
        add_server_arguments,
        add_verbose_argument,
    )

    add_config_argument(parser)
    add_device_arguments(parser)
    add_server_arguments(parser, port=9872, port_note="as the official TTS page")
    add_knob_arguments(parser, warmup=True)
    add_verbose_argument(parser)
    parser.add_argument("--share", action="store_true", help="also open a public Gradio share link (72 h)")
    parser.add_argument("--auth", default=None, metavar="USER:PASS|FILE",
                        help="require a login: USER:PASS, or a file with one USER:PASS per line")
    parser.add_argument("--allowed-host", action="append", default=None, metavar="NAME",
                        help="a dotted host name browsers use to reach this page (IP addresses, localhost and names "
                             "without a dot always work); repeatable")


def run(args: argparse.Namespace) -> int:
    import logging

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from studio.cli.bootstrap import (
        build_studio,
        load_engine_config,
        quiet_libraries,
        start_warmup,
        token_cap,
        voices_folder,
    )
    from studio.http.context import ServerSettings
    from studio.http.limits import limits_from_args
    from webui.app import UISettings
    from webui.models_list import ModelCatalog
    from webui.server import create_webui_app, own_file_folder, parse_auth

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_libraries(args.verbose)
    auth = parse_auth(args.auth) if args.auth else None
    config = load_engine_config(args.config, required=True)
    catalog = ModelCatalog(config.base_dir, extra_dirs=(  # the config's folder tree, the working folder
        *(config.path(k).parent for k in ("t2s_weights_path", "vits_weights_path")), Path(config.source).parent,
        Path.cwd()))
    roots = tuple(str(d) for d in catalog.folders)
    studio = build_studio(config, args, weight_roots=roots)
    max_tokens = token_cap(config, args)
    server_settings = ServerSettings(weight_roots=roots, profiles_dir=voices_folder(args.profiles_dir),
                                     limits=limits_from_args(args, max_tokens_per_sentence=max_tokens),
                                     # a share link reaches the page under *.gradio.live
                                     allowed_hosts=tuple(args.allowed_host or ()) + ((".gradio.live",) if args.share
                                                                                     else ()))
    ui = UISettings(max_tokens_per_sentence=max_tokens, random_weights=config.active.random_weights,
                    device_fallback=config.active.device if studio.device_notice else "")
    print("listing weight files...", file=sys.stderr)
    with own_file_folder():  # uploads, clips and example copies: no other instance can delete them
        app = create_webui_app(studio, config, ui, server_settings, auth, concurrency=args.workers,
                               max_queue=args.max_queue, catalog=catalog)
        start_warmup(studio, config, args, app)
        return _run(app, args.host, args.port, share=args.share, protected=bool(auth))


def _run(app, host: str, port: int, share: bool, protected: bool) -> int:
    import signal

    from studio.http.lifecycle import DrainingServer, uvicorn_config

    ctx = app.state.context
    server = DrainingServer(uvicorn_config(app, host, port, ctx.limits, log_level="warning"), ctx)
    signal.signal(signal.SIGTERM, lambda *_: server.request_exit())  # uvicorn runs in a thread: no handlers of its own
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
        server.request_exit()
        thread.join(ctx.limits.shutdown_grace_s + 5)
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
