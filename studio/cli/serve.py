"""`sovits-studio serve [-c CONFIG] [-a HOST] [-p PORT]`: the api_v2-compatible HTTP server (+ OpenAI speech)."""

from __future__ import annotations

import argparse

# where the official WebUI saves trained weights, and the pretrained folder (relative to the GPT-SoVITS root)
OFFICIAL_WEIGHT_DIRS = ("GPT_SoVITS/pretrained_models", "GPT_weights", "GPT_weights_v2", "GPT_weights_v3",
                        "GPT_weights_v4", "GPT_weights_v2Pro", "GPT_weights_v2ProPlus", "SoVITS_weights",
                        "SoVITS_weights_v2", "SoVITS_weights_v3", "SoVITS_weights_v4", "SoVITS_weights_v2Pro",
                        "SoVITS_weights_v2ProPlus")


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
    add_server_arguments(parser, port=9880, port_note="as api_v2.py")
    add_knob_arguments(parser, warmup=True)
    add_verbose_argument(parser)
    parser.add_argument("--reference-dir", action="append", default=None, metavar="DIR",
                        help="folder that ref_audio_path may name files in (repeatable; default: the working folder)")
    parser.add_argument("--weights-dir", action="append", default=None, metavar="DIR",
                        help="folder weight files may be loaded from (repeatable; default: the official weight "
                             "folders and the folders of the configured weights)")
    parser.add_argument("--no-voice-uploads", action="store_true", help="refuse POST/DELETE /v1/voices")
    parser.add_argument("--api-key", action="append", default=None, metavar="KEY",
                        help="require this key on every route ('Authorization: Bearer KEY' or 'X-API-Key: KEY'); "
                             "repeatable; prefer --api-key-file (a command line is visible to other users)")
    parser.add_argument("--api-key-file", default=None, metavar="FILE", help="keys as --api-key, one per line")
    parser.add_argument("--allow-control", action="store_true",
                        help="accept /control (restart, exit) without an API key (with a key it is always on)")
    parser.add_argument("--allowed-host", action="append", default=None, metavar="NAME",
                        help="a dotted host name clients use to reach this server without an API key (IP "
                             "addresses, localhost and names without a dot always work); repeatable")


def run(args: argparse.Namespace) -> int:
    import logging
    import os
    import sys
    from pathlib import Path

    from studio.cli.bootstrap import (
        build_studio,
        incomplete_weights_warning,
        load_engine_config,
        quiet_libraries,
        start_warmup,
        token_cap,
        voices_folder,
    )
    from studio.http.app import create_app
    from studio.http.auth import Access, check_keys, read_key_file
    from studio.http.context import ServerSettings
    from studio.http.lifecycle import DrainingServer, uvicorn_config, wait_for_workers
    from studio.http.limits import limits_from_args

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_libraries(args.verbose)
    config = load_engine_config(args.config, required=False)
    warning = incomplete_weights_warning(config)
    if warning:
        print(warning, file=sys.stderr)
    weight_dirs = args.weights_dir
    if not weight_dirs:
        configured = [config.path(k).parent for k in ("t2s_weights_path", "vits_weights_path")]
        weight_dirs = [str(Path(d).resolve()) for d in (*OFFICIAL_WEIGHT_DIRS, *configured)]
    keys = tuple(args.api_key or ()) + (read_key_file(args.api_key_file) if args.api_key_file else ())
    settings = ServerSettings(
        reference_roots=tuple(args.reference_dir or [os.getcwd()]),
        weight_roots=tuple(weight_dirs),
        profiles_dir=voices_folder(args.profiles_dir),
        voice_uploads=not args.no_voice_uploads,
        limits=limits_from_args(args, max_tokens_per_sentence=token_cap(config, args)),
        access=Access(api_keys=check_keys(keys)),
        allow_control=args.allow_control,
        allowed_hosts=tuple(args.allowed_host or ()),
    )
    studio = build_studio(config, args, weight_roots=settings.weight_roots)
    state = {"restart": False}
    server: DrainingServer | None = None

    def on_control(command: str) -> None:
        state["restart"] = command == "restart"
        if server is not None:
            server.request_exit()  # as SIGTERM: queued requests get 503, running ones the grace period

    app = create_app(studio, settings, on_control=on_control)
    start_warmup(studio, config, args, app)
    host = None if args.host == "None" else args.host  # api_v2: `-a None` listens dual-stack
    server = DrainingServer(uvicorn_config(app, host or "::", args.port, settings.limits), app.state.context)
    server.run()  # SIGTERM: drain, then at most shutdown_grace_s for running requests
    if not wait_for_workers(app.state.context, 1.0):
        os._exit(1)  # a worker is still inside one step of synthesis: do not wait for it
    if state["restart"]:
        os.execv(sys.executable, sys.orig_argv)  # the same command line, as api_v2's restart does
    return 0
