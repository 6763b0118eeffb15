"""`sovits-studio make-test-weights DIR --version V [--full-size]`: a random model set in the official formats."""

from __future__ import annotations

import argparse

from engine.versions import VERSIONS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out_dir", metavar="DIR", help="folder to write GPT_SoVITS/pretrained_models/... and tts_infer.yaml into")
    parser.add_argument("--version", required=True, choices=VERSIONS)
    parser.add_argument("--full-size", action="store_true", help="official dimensions (hundreds of MB; for benchmarks)")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    from engine.testweights import make_test_weights

    config = make_test_weights(args.out_dir, args.version, args.full_size, args.seed)
    print(f"wrote a random {args.version} model set; config: {config}")
    return 0
