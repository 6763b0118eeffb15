"""`sovits-studio make-test-weights DIR --version V [--full-size]`: a random model set in the official formats."""

from __future__ import annotations

import argparse
import shlex

from engine.versions import VERSIONS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out_dir", metavar="DIR", help="folder to write GPT_SoVITS/pretrained_models/... and tts_infer.yaml into")
    parser.add_argument("--version", required=True, choices=VERSIONS)
    parser.add_argument("--full-size", action="store_true", help="official dimensions (hundreds of MB; for benchmarks)")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    from engine.testweights import TEST_TOKEN_CAP, make_test_weights

    config = make_test_weights(args.out_dir, args.version, args.full_size, args.seed)
    print(f"wrote a random {args.version} model set; config: {config}")
    print(f"next, try it in the browser (random weights make noise, not speech; each sentence stops after "
          f"{TEST_TOKEN_CAP / 25:g} s):\n  sovits-studio webui --config {shlex.quote(str(config))}")
    return 0
