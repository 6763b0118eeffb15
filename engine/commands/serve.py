"""`sovits-studio serve [-c CONFIG] [-a HOST] [-p PORT]`: the api_v2-compatible HTTP server (+ OpenAI speech)."""

from __future__ import annotations

import argparse

OFFICIAL_CONFIG = "GPT_SoVITS/configs/tts_infer.yaml"
# where the official WebUI saves trained weights, and the pretrained folder (relative to the GPT-SoVITS root)
OFFICIAL_WEIGHT_DIRS = ("GPT_SoVITS/pretrained_models", "GPT_weights", "GPT_weights_v2", "GPT_weights_v3",
                        "GPT_weights_v4", "GPT_weights_v2Pro", "GPT_weights_v2ProPlus", "SoVITS_weights",
                        "SoVITS_weights_v2", "SoVITS_weights_v3", "SoVITS_weights_v4", "SoVITS_weights_v2Pro",
                        "SoVITS_weights_v2ProPlus")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", default=None,
                        help=f"tts_infer.yaml (default: {OFFICIAL_CONFIG} if present, else the built-in v2 defaults)")
    parser.add_argument("-a", "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("-p", "--port", type=int, default=9880, help="port (default 9880, as api_v2.py)")
    parser.add_argument("--device", default=None, help="override the config's device (cpu, cuda, cuda:1, mps)")
    parser.add_argument("--precision", default=None, choices=("fp32", "fp16", "bf16"),
                        help="override the config's is_half")
    parser.add_argument("--reference-dir", action="append", default=None, metavar="DIR",
                        help="folder that ref_audio_path may name files in (repeatable; default: the working folder)")
    parser.add_argument("--weights-dir", action="append", default=None, metavar="DIR",
                        help="folder weight files may be loaded from (repeatable; default: the official weight "
                             "folders and the folders of the configured weights)")
    parser.add_argument("--profiles-dir", default="voices",
                        help="saved voices for /v1/audio/speech (default: ./voices)")
    parser.add_argument("--no-voice-uploads", action="store_true", help="refuse POST/DELETE /v1/voices")
    parser.add_argument("--workers", type=int, default=1, help="requests synthesised at once (default 1)")
    parser.add_argument("--max-queue", type=int, default=32, help="requests waiting beyond that (default 32)")
    parser.add_argument("--max-upload-mb", type=float, default=20.0, help="request body limit in MiB (default 20)")
    parser.add_argument("--max-tokens-per-sentence", type=int, default=None,
                        help="cap semantic tokens per sentence (25 per second of audio; default: the GPT file's limit)")
    parser.add_argument("--max-text-chars", type=int, default=10_000, help="longest text accepted (default 10000)")


def run(args: argparse.Namespace) -> int:
    import logging
    import os
    import sys
    from pathlib import Path

    import uvicorn

    from engine.config import load_config, parse_config
    from engine.options import EngineSettings
    from engine.pipeline import Studio
    from engine.server.app import ServerSettings, create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.config:
        config = load_config(args.config)
    elif Path(OFFICIAL_CONFIG).is_file():
        config = load_config(OFFICIAL_CONFIG)
    else:
        config = parse_config({}, "built-in defaults")
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
        max_upload_bytes=int(args.max_upload_mb * (1 << 20)),
        workers=args.workers,
        max_queue=args.max_queue,
        max_tokens_per_sentence=args.max_tokens_per_sentence,
    )
    studio = Studio.from_config(config, device=args.device, precision=args.precision,
                                settings=EngineSettings(weight_roots=settings.weight_roots,
                                                        max_text_chars=args.max_text_chars))
    if studio.device_notice:
        print(f"warning: {studio.device_notice}", file=sys.stderr)
    state = {"restart": False}
    server: uvicorn.Server | None = None

    def on_control(command: str) -> None:
        state["restart"] = command == "restart"
        if server is not None:
            server.should_exit = True  # graceful: running requests finish, then the process ends

    app = create_app(studio, settings, on_control=on_control)
    host = None if args.host == "None" else args.host  # api_v2: `-a None` listens dual-stack
    server = uvicorn.Server(uvicorn.Config(app, host=host or "::", port=args.port, workers=1))
    server.run()
    if state["restart"]:
        os.execv(sys.executable, sys.orig_argv)  # the same command line, as api_v2's restart does
    return 0
