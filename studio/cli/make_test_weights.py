"""`sovits-studio make-test-weights DIR --version V [--full-size] [--t2s-width W --t2s-heads H --t2s-layers L]`:
a random model set in the official formats, optionally with other GPT widths (e.g. head width 24 = 384 / 16)."""

from __future__ import annotations

import argparse
import shlex
import sys

from engine.versions import VERSIONS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out_dir", metavar="DIR", help="folder to write GPT_SoVITS/pretrained_models/... and tts_infer.yaml into")
    parser.add_argument("--version", required=True, choices=VERSIONS)
    parser.add_argument("--full-size", action="store_true", help="official dimensions (hundreds of MB; for benchmarks)")
    parser.add_argument("--seed", type=int, default=0)
    shape = parser.add_argument_group("GPT shape (defaults: tiny, or the official with --full-size; the FFN is 4 x width)")
    shape.add_argument("--t2s-width", type=int, metavar="W", help="model width (hidden_dim = embedding_dim)")
    shape.add_argument("--t2s-heads", type=int, metavar="H", help="attention heads (W must be a multiple of H)")
    shape.add_argument("--t2s-layers", type=int, metavar="L", help="transformer blocks")


def run(args: argparse.Namespace) -> int:
    from engine.testweights import TEST_TOKEN_CAP, make_test_weights

    shape = {key: value for key, value in (("hidden_dim", args.t2s_width), ("head", args.t2s_heads),
                                            ("n_layer", args.t2s_layers)) if value is not None}
    try:
        config = make_test_weights(args.out_dir, args.version, args.full_size, args.seed, shape or None)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote a random {args.version} model set; config: {config}")
    print(f"next, try it in the browser (random weights make noise, not speech; each sentence stops after "
          f"{TEST_TOKEN_CAP / 25:g} s):\n  sovits-studio webui --config {shlex.quote(str(config))}")
    return 0
