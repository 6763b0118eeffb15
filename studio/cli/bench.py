"""`sovits-studio bench`: per-stage and end-to-end speed, latency and memory on a fixed workload."""

from __future__ import annotations

import argparse
import json
import sys

from engine.versions import VERSIONS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from studio.cli.bootstrap import add_device_arguments, add_verbose_argument

    src = parser.add_mutually_exclusive_group()
    src.add_argument("--random-weights", metavar="VERSION", choices=VERSIONS, default="v2ProPlus",
                     help="random weights of this version at official size (default v2ProPlus)")
    src.add_argument("--config", help="a tts_infer.yaml with real weights instead")
    parser.add_argument("--tiny", action="store_true", help="tiny random weights and a short workload (CI-size)")
    add_device_arguments(parser, device="auto", precision="auto")
    parser.add_argument("--tokens", type=int, default=None, help="T2S tokens per timed decode (default 500; 20 with --tiny)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per stage (default 3; 1 with --tiny)")
    parser.add_argument("--batches", default=None, help="comma-separated T2S batch sizes (default 8,32,64; 2 with --tiny)")
    parser.add_argument("--streams", default=None,
                        help="comma-separated counts of concurrent in-process streams (default 1,2,4,8; 1,2 with --tiny)")
    parser.add_argument("--ref", help="reference clip (default: a generated 5 s clip)")
    parser.add_argument("--ref-text", default=None)
    parser.add_argument("--ref-lang", default="zh")
    parser.add_argument("--t2s-decoder", default="auto", choices=("auto", "fast", "reference", "int8"),
                        help="T2S decoder (int8: opt-in CPU quantisation)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    add_verbose_argument(parser)


def run(args: argparse.Namespace) -> int:
    from studio.bench import REF_TEXT, BenchConfig, format_report, run_benchmark
    from studio.cli.bootstrap import quiet_libraries

    quiet_libraries(args.verbose)

    tokens = args.tokens or (20 if args.tiny else 500)
    repeats = args.repeats or (1 if args.tiny else 3)
    batches = tuple(int(b) for b in (args.batches or ("2" if args.tiny else "8,32,64")).split(",") if b)
    streams = tuple(int(n) for n in (args.streams or ("1,2" if args.tiny else "1,2,4,8")).split(",") if n)
    cfg = BenchConfig(version=args.random_weights, config=args.config, tiny=args.tiny, device=args.device,
                      precision=args.precision, tokens=tokens, repeats=repeats, batches=batches, streams=streams,
                      reference=args.ref, reference_text=args.ref_text or REF_TEXT, reference_lang=args.ref_lang,
                      t2s_decoder=args.t2s_decoder, vocoder_backend=args.vocoder_backend)
    report = run_benchmark(cfg, log=lambda s: print(s, file=sys.stderr, flush=True))
    print(json.dumps(report, indent=1, ensure_ascii=False) if args.json else format_report(report))
    return 0
