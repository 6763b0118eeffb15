"""`sovits-studio inspect PATH [--json]`: kind, version, dimensions, parameters and dtype of a weight file.

PATH may also be a folder of model files (the one ``make-test-weights`` or ``download`` fills): every weight
file and model folder under it is described."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

WEIGHT_SUFFIXES = (".ckpt", ".pth", ".pt")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="a .ckpt/.pth/.pt file, a model folder, or a folder of them (e.g. make-test-weights DIR)")
    parser.add_argument("--json", action="store_true", help="print JSON (one object per path, in a list)")


def run(args: argparse.Namespace) -> int:
    from engine.errors import CheckpointError
    from engine.loading.inspection import describe, format_description

    results, failed = [], 0
    for path in (p for given in args.paths for p in model_paths(given)):
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


def model_paths(path: str) -> list[str]:
    """``path`` itself when it is a file or a model folder (one with config.json); for any other folder,
    the weight files and model folders under it, in path order (``path`` itself when it holds none, so
    that describing it says why)."""
    root = Path(path)
    if not root.is_dir() or (root / "config.json").is_file():
        return [path]
    found: list[Path] = []
    for config in sorted(root.rglob("config.json")):
        found.append(config.parent)
    models = tuple(found)
    for f in sorted(root.rglob("*")):
        if f.is_file() and f.suffix in WEIGHT_SUFFIXES and not any(m in f.parents for m in models):
            found.append(f)
    return [str(p) for p in sorted(found)] or [path]
