"""`sovits-studio webui`: the web page and the HTTP API on one port (the README's main command)."""

from __future__ import annotations

import argparse

DEFAULT_CONFIG = "configs/tts_infer.yaml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", default=DEFAULT_CONFIG, help=f"tts_infer.yaml (default {DEFAULT_CONFIG})")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for all)")
    parser.add_argument("-p", "--port", type=int, default=9872, help="port (default 9872, as the official TTS page)")
    parser.add_argument("--share", action="store_true", help="also open a public Gradio share link (72 h)")
    parser.add_argument("--auth", default=None, metavar="USER:PASS|FILE",
                        help="require a login: USER:PASS, or a file with one USER:PASS per line")
    parser.add_argument("--device", default=None, help="override the config's device (auto, cpu, cuda, cuda:1, mps)")
    parser.add_argument("--precision", default=None, choices=("auto", "fp32", "fp16", "bf16"),
                        help="override the config's is_half")
    parser.add_argument("--max-upload-mb", type=float, default=20.0, help="largest upload in MiB (default 20)")
    parser.add_argument("--workers", type=int, default=1, help="syntheses run at once, page and API together (default 1)")
    parser.add_argument("--max-queue", type=int, default=32, help="requests waiting beyond that (default 32)")
    parser.add_argument("--max-tokens-per-sentence", type=int, default=None,
                        help="cap semantic tokens per sentence (25 per second of audio; default: the model's limit)")
    parser.add_argument("--max-text-chars", type=int, default=10_000, help="longest text accepted (default 10000)")
    parser.add_argument("--profiles-dir", default="voices", help="saved voices for /v1/audio/speech (default ./voices)")


def run(args: argparse.Namespace) -> int:
    from webui.server import serve

    return serve(args)
