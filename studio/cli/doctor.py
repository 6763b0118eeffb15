"""`sovits-studio doctor`: where every stage runs, in which precision, and why.

Builds the engine from the config as ``serve`` would (same ``--device`` / ``--precision`` flags), runs one short
synthesis (the start-up warm-up: it loads the models and meets every stage once, so a stage whose operator the
device lacks is found and moved to the CPU), then prints each stage's device, precision, backend and the reason,
the stages that fell back to the CPU with the device's error, and the CPU thread setup. ``--json`` prints the
same report as ``/health`` carries it under ``stages``.
"""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from studio.cli.bootstrap import add_config_argument, add_device_arguments, add_verbose_argument

    add_config_argument(parser)
    add_device_arguments(parser)
    parser.add_argument("--no-run", dest="run", action="store_false",
                        help="do not synthesise first: report the plan only (fallbacks are found when a stage runs)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    add_verbose_argument(parser)


def run(args: argparse.Namespace) -> int:
    from studio.cli.bootstrap import build_studio, load_engine_config, quiet_libraries

    quiet_libraries(args.verbose)
    config = load_engine_config(args.config, required=True)
    studio = build_studio(config, args)
    try:
        errors: tuple[str, ...] = ()
        if args.run:
            from engine.warmup import WarmupSettings, warm_up

            print("running one short synthesis to meet every stage ...", file=sys.stderr)
            errors = tuple(warm_up(studio, settings=WarmupSettings(languages=("zh",))).errors)
        from engine.stage_report import format_report, stage_report

        report = stage_report(studio)
        if errors:
            report["run_errors"] = list(errors)
        if args.json:
            print(json.dumps(report, indent=1))
        else:
            print(format_report(report))
            for e in errors:
                print(f"synthesis failed: {e}")
        return 1 if errors else 0
    finally:
        studio.close()
