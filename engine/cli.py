"""`sovits-studio` command line: one subcommand per module, each loaded only when it runs."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, one-line help). Each module defines `add_arguments(parser)` and `run(args) -> int`.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "inspect": ("engine.commands.inspect", "describe a GPT-SoVITS weight file or folder"),
    "make-test-weights": ("engine.commands.make_test_weights", "write a random model set in the official formats"),
    "g2p": ("engine.commands.g2p", "print the phones, ids, word2ph and normalised text for a text"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sovits-studio", description="GPT-SoVITS voice cloning engine")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    from engine.errors import EngineError

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        return int(importlib.import_module(args._module).run(args) or 0)
    except EngineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
