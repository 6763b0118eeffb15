"""`sovits-studio` command line: one subcommand per module, each loaded only when it runs."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, one-line help). Each module defines `add_arguments(parser)` and `run(args) -> int`.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "inspect": ("studio.cli.inspect", "describe a GPT-SoVITS weight file or folder"),
    "make-test-weights": ("studio.cli.make_test_weights", "write a random model set in the official formats"),
    "g2p": ("studio.cli.g2p", "print the phones, ids, word2ph and normalised text for a text"),
    "synth": ("studio.cli.synth", "clone a voice: text + reference clip -> wav"),
    "download": ("studio.cli.download", "fetch the official pretrained weights into the official layout"),
    "serve": ("studio.cli.serve", "run the api_v2-compatible HTTP server (with OpenAI speech and /metrics)"),
    "export-coreml": ("studio.cli.export_coreml", "convert a vocoder (bigvgan, v4, v2) to a Core ML package"),
    "bench": ("studio.cli.bench", "benchmark each stage and end to end (speed, latency, memory)"),
    "loadtest": ("studio.cli.loadtest", "drive a running server with concurrent streaming clients (latency, throughput)"),
    "webui": ("studio.cli.webui", "the web UI and the HTTP API on one port (voice cloning in the browser)"),
    "doctor": ("studio.cli.doctor", "where every stage runs (device, precision, CPU fallbacks) and why"),
    "cluster": ("studio.cli.cluster", "the HTTP API on a Ray Serve cluster: replicas, routing by model, failover"),
}


# optional packages -> the pyproject extra that installs them
EXTRAS = {"gradio": "webui", "fastapi": "server", "starlette": "server", "uvicorn": "server", "multipart": "server",
          "python_multipart": "server"}


def _usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {help_text}" for name, (_, help_text) in SUBCOMMANDS.items())
    return (f"usage: sovits-studio COMMAND [options]\n       sovits-studio --version\n\nGPT-SoVITS voice cloning "
            f"engine.\n\ncommands:\n{rows}\n")


def version() -> str:
    """The installed package's version (the one pyproject.toml gives)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("sovits-studio")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e . from the checkout)"


def build_parser(name: str) -> argparse.ArgumentParser:
    """The parser of one subcommand; only that subcommand's module is imported."""
    module, help_text = SUBCOMMANDS[name]
    parser = argparse.ArgumentParser(prog=f"sovits-studio {name}", description=help_text)
    importlib.import_module(module).add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    from engine.platform_env import enable_mps_fallback

    enable_mps_fallback()  # must precede the first torch import (commands import torch lazily)
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(f"sovits-studio {version()}")
        return 0
    name = argv[0]
    if name not in SUBCOMMANDS:
        print(f"sovits-studio: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    args = build_parser(name).parse_args(argv[1:])
    from engine.errors import EngineError
    from engine.loading.model_pool import WeightsNotFoundError

    module = importlib.import_module(SUBCOMMANDS[name][0])
    try:
        return int(module.run(args) or 0)
    except EngineError as e:
        flag = module.flag_for(e.field) if e.field and hasattr(module, "flag_for") else None
        print(f"error: {flag}: {e}" if flag else f"error: {e}", file=sys.stderr)
        if isinstance(e, WeightsNotFoundError):
            print("hint: `sovits-studio download` fetches the official weights into the paths the config names; "
                  "`sovits-studio make-test-weights DIR` writes a random model set to try the tools with",
                  file=sys.stderr)
        return 1
    except ModuleNotFoundError as e:
        extra = EXTRAS.get((e.name or "").split(".")[0])
        if extra is None:
            raise
        print(f"error: `sovits-studio {name}` needs {e.name}, which the [{extra}] extra installs: "
              f"pip install -e '.[{extra}]' (from a checkout) or pip install 'sovits-studio[{extra}]'", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
