"""`sovits-studio inspect PATH [--json]`: kind, version, dimensions, parameters and dtype of a weight file."""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="a .ckpt/.pth/.pt file or a model folder")
    parser.add_argument("--json", action="store_true", help="print JSON (one object per path, in a list)")


def run(args: argparse.Namespace) -> int:
    from engine.errors import CheckpointError
    from engine.loading.inspection import describe, format_description

    results, failed = [], 0
    for path in args.paths:
        try:
            results.append(describe(path))
        except CheckpointError as e:
            failed += 1
            results.append({"path": path, "error": str(e)})
    if args.json:
        print(json.dumps(results, indent=2, ensure_ascii=False))
    else:
        for r in results:
            print(f"{r['path']}\n  error: {r['error']}" if "error" in r else format_description(r))
    return 1 if failed else 0
