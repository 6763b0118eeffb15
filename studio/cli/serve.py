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
    )

    add_config_argument(parser)
    add_device_arguments(parser)
    add_server_arguments(parser, port=9880, port_note="as api_v2.py")
    add_knob_arguments(parser, warmup=True)
    parser.add_argument("--reference-dir", action="append", default=None, metavar="DIR",
                        help="folder that ref_audio_path may name files in (repeatable; default: the working folder)")
    parser.add_argument("--weights-dir", action="append", default=None, metavar="DIR",
                        help="folder weight files may be loaded from (repeatable; default: the official weight "
                             "folders and the folders of the configured weights)")
    parser.add_argument("--no-voice-uploads", action="store_true", help="refuse POST/DELETE /v1/voices")


def run(args: argparse.Namespace) -> int:
    import logging
    import os
    import sys
    from pathlib import Path

    import uvicorn

    from studio.cli.bootstrap import MIB, build_studio, load_engine_config, start_warmup
    from studio.http.app import create_app
    from studio.http.context import ServerSettings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = load_engine_config(args.config, required=False)
    missing = config.missing_files()
    if missing:
        listed = "\n".join(f"  {k}: {p}" for k, p in missing.items())
        print(f"warning: the default weights are incomplete ({config.source}):\n{listed}\n"
              f"Run `sovits-studio download --version {config.active.version}`; requests naming other weights "
              f"still work.", file=sys.stderr)
    weight_dirs = args.weights_dir
    if not weight_dirs:
        configured = [config.path(k).parent for k in ("t2s_weights_path", "vits_weights_path")]
        weight_dirs = [str(Path(d).resolve()) for d in (*OFFICIAL_WEIGHT_DIRS, *configured)]
    settings = ServerSettings(
        reference_roots=tuple(args.reference_dir or [os.getcwd()]),
        weight_roots=tuple(weight_dirs),
        profiles_dir=args.profiles_dir,
        voice_uploads=not args.no_voice_uploads,
        max_upload_bytes=int(args.max_upload_mb * MIB),
        workers=args.workers,
        max_queue=args.max_queue,
        max_tokens_per_sentence=args.max_tokens_per_sentence,
    )
    studio = build_studio(config, args, weight_roots=settings.weight_roots)
    state = {"restart": False}
    server: uvicorn.Server | None = None

    def on_control(command: str) -> None:
        state["restart"] = command == "restart"
        if server is not None:
            server.should_exit = True  # graceful: running requests finish, then the process ends

    app = create_app(studio, settings, on_control=on_control)
    start_warmup(studio, config, args, app)
    host = None if args.host == "None" else args.host  # api_v2: `-a None` listens dual-stack
    server = uvicorn.Server(uvicorn.Config(app, host=host or "::", port=args.port, workers=1))
    server.run()
    if state["restart"]:
        os.execv(sys.executable, sys.orig_argv)  # the same command line, as api_v2's restart does
    return 0
