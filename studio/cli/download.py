"""`sovits-studio download [--version V ...] [--root DIR] [--check]`: the official pretrained files."""

from __future__ import annotations

import argparse
import sys

from engine.versions import VERSIONS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="append", choices=(*VERSIONS, "all"), dest="versions",
                        help="model version(s) to fetch (repeatable; default v2; 'all' for every version)")
    parser.add_argument("--root", default=".",
                        help="the GPT-SoVITS root: files go to ROOT/GPT_SoVITS/pretrained_models/ (default: .)")
    parser.add_argument("--g2pw", action=argparse.BooleanOptionalAction, default=None,
                        help="the G2PW polyphone model for Mandarin (default: with any v2+ version, as the official "
                             "frontend uses it; --no-g2pw skips it)")
    parser.add_argument("--revision", default="main", help="hub revision (branch, tag or commit) to fetch")
    parser.add_argument("--check", action="store_true",
                        help="fetch nothing: say what is missing or not the official file, and where it goes")
    parser.add_argument("--no-verify", action="store_true", help="skip the sha256 check against the hub")


def run(args: argparse.Namespace) -> int:
    from engine.loading.download import assets_for, check, check_command, download, missing_message

    versions = args.versions or ["v2"]
    if "all" in versions:
        versions = list(VERSIONS)
    assets = assets_for(dict.fromkeys(versions), g2pw=args.g2pw)
    command = check_command(versions, args.root, args.g2pw)
    if args.check:
        missing, wrong = check(args.root, assets)
        for _, problem in wrong:
            print(f"wrong: {problem}", file=sys.stderr)
        if missing:
            print(missing_message(args.root, missing, check_command=command), file=sys.stderr)
        if not missing and not wrong:
            print(f"all {len(assets)} file(s) for {', '.join(versions)} are present and look official")
        return 1 if missing or wrong else 0
    report = download(args.root, assets, revision=args.revision, verify_checksums=not args.no_verify,
                      check_command=command)
    print(f"done: {len(report.fetched)} fetched, {len(report.present)} already present")
    return 0
