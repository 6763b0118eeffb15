"""`sovits-studio download [--version V ...] [--root DIR] [--check]`: the official pretrained files."""

from __future__ import annotations

import argparse
import sys

from engine.versions import VERSIONS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="append", choices=(*VERSIONS, "all"), dest="versions",
                        help="model version(s) to fetch (repeatable; default v2, or none with --g2pw; 'all' for "
                             "every version)")
    parser.add_argument("--root", default=".",
                        help="the GPT-SoVITS root: files go to ROOT/GPT_SoVITS/pretrained_models/ (default: .)")
    parser.add_argument("--g2pw", action=argparse.BooleanOptionalAction, default=None,
                        help="the G2PW polyphone model for Mandarin (default: with any v2+ version, as the official "
                             "frontend uses it; --g2pw without --version: G2PW alone; --no-g2pw skips it). Its "
                             "correction tables come from GitHub: SOVITS_STUDIO_GITHUB_MIRROR names a mirror of "
                             "raw.githubusercontent.com (HF_ENDPOINT one of the hub)")
    parser.add_argument("--revision", action="append", default=[], metavar="[REPO=]REV",
                        help="hub revision (branch, tag or commit) of one repository, e.g. "
                             "lj1995/GPT-SoVITS=<commit> (repeatable; a bare REV is the weights repository's; "
                             "default main for each)")
    parser.add_argument("--check", action="store_true",
                        help="fetch nothing: say what is missing or not the official file, and where it goes")
    parser.add_argument("--no-verify", action="store_true", help="skip the sha256 check against the hub")
    parser.add_argument("--offline", action="store_true",
                        help="with --check: do not ask the hub for the sizes (check the files' heads only)")


def run(args: argparse.Namespace) -> int:
    from engine.loading.download import assets_for, check, check_command, download, missing_message

    versions = args.versions or ([] if args.g2pw else ["v2"])  # --g2pw alone: G2PW, not the v2 weights with it
    if "all" in versions:
        versions = list(VERSIONS)
    assets = assets_for(dict.fromkeys(versions), g2pw=args.g2pw)
    command = check_command(versions, args.root, args.g2pw)
    if args.check:
        from engine.loading.download import hub_sizes

        sizes = {} if args.offline else hub_sizes(assets, parse_revisions(args.revision))
        if not sizes and not args.offline:
            print("note: the hub cannot be reached; sizes are not compared (files are checked by their heads)",
                  file=sys.stderr)
        missing, wrong = check(args.root, assets, sizes)
        for _, problem in wrong:
            print(f"wrong: {problem}", file=sys.stderr)
        if missing:
            print(missing_message(args.root, missing, check_command=command), file=sys.stderr)
        if not missing and not wrong:
            print(f"all {len(assets)} file(s) for {', '.join(versions) or 'G2PW'} are present and look official")
        return 1 if missing or wrong else 0
    revisions = parse_revisions(args.revision)
    with _ProgressBar() as bar:
        report = download(args.root, assets, revisions=revisions, verify_checksums=not args.no_verify,
                          check_command=command, on_progress=bar.update)
    again = f" ({len(report.refetched)} of them again: the copy there failed its check)" if report.refetched else ""
    print(f"done: {len(report.fetched)} fetched{again}, {len(report.present)} already present")
    return 0


def parse_revisions(values: list[str]) -> dict[str, str]:
    """``REPO=REV`` (or a bare ``REV`` for the weights repository) -> {repo: rev}; a repository we do not fetch from
    is an error naming the ones we do."""
    from engine.errors import OptionsError
    from engine.loading.download import BIGVGAN_REPO, G2PW_REPO, WEIGHTS_REPO

    known = (WEIGHTS_REPO, BIGVGAN_REPO, G2PW_REPO)
    out: dict[str, str] = {}
    for value in values:
        repo, sep, rev = value.rpartition("=")
        repo = repo if sep else WEIGHTS_REPO
        if repo not in known or not rev:
            raise OptionsError(f"--revision {value!r}: use REPO=REV with REPO one of {', '.join(known)}, or a bare REV "
                               f"for {WEIGHTS_REPO}")
        out[repo] = rev
    return out


class _ProgressBar:
    """The terminal's bar over the whole download: bytes (the hub's sizes) and files, beside the hub client's
    per-file bars."""

    def __enter__(self) -> "_ProgressBar":
        self._bar = None
        return self

    def update(self, files: int, total_files: int, done: int, total: int) -> None:
        from tqdm import tqdm

        if self._bar is None:
            self._bar = tqdm(total=total or None, unit="B", unit_scale=True, unit_divisor=1024, desc="download",
                             file=sys.stderr)
        self._bar.n = done
        self._bar.set_postfix_str(f"{files}/{total_files} files", refresh=True)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.close()
