"""`sovits-studio loadtest`: concurrent streaming clients against a running server, and what they got."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _clients(value: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: give client counts >= 1, comma-separated (e.g. 1,2,4,8)")
    return counts


def _field(value: str) -> tuple[str, object]:
    name, sep, raw = value.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{value!r}: write a request field as NAME=VALUE (e.g. top_k=5)")
    try:
        return name, json.loads(raw)
    except ValueError:
        return name, raw


def _names(value: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"{value!r}: give language codes, comma-separated (e.g. zh,en,ja)")
    return names


def _modes(value: str) -> tuple[int, ...]:
    try:
        modes = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        modes = ()
    if not modes or any(m not in (0, 1, 2, 3) for m in modes):
        raise argparse.ArgumentTypeError(f"{value!r}: give api_v2 streaming modes 0-3, comma-separated (e.g. 2,0)")
    return modes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:9880", help="the server (default http://127.0.0.1:9880)")
    parser.add_argument("--endpoint", choices=("tts", "speech"), default="tts",
                        help="tts: api_v2 /tts (default); speech: OpenAI /v1/audio/speech (WAV)")
    parser.add_argument("--clients", type=_clients, default=(1,), metavar="N[,N...]",
                        help="concurrent clients; a list sweeps them one level after another (default 1)")
    parser.add_argument("--rate", type=float, default=None, metavar="R",
                        help="fixed arrival rate in requests/s (then --clients caps requests in flight); "
                             "default: closed loop, each client sends its next request when the last one ends")
    parser.add_argument("--duration", type=float, default=None, metavar="S",
                        help="seconds per level in which requests start (default 30 unless --requests is given)")
    parser.add_argument("--requests", type=int, default=None, metavar="N", help="at most N requests per level")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="S",
                        help="longest a request may take, from when it is due to its last byte (default 300)")
    parser.add_argument("--warmup", type=int, default=1, metavar="N",
                        help="requests sent one by one before measuring, not counted (default 1)")
    work = parser.add_argument_group("workload (default: the bench's medium Chinese text and a built-in clip)")
    work.add_argument("--text", default=None, help="text to speak (@FILE reads a file)")
    work.add_argument("--text-lang", default="zh")
    work.add_argument("--streaming-mode", type=int, choices=(0, 1, 2, 3), default=2,
                      help="api_v2 streaming_mode: 0 whole file, 1 per sentence, 2 token chunks (default), 3 fixed")
    ref = work.add_mutually_exclusive_group()
    ref.add_argument("--ref", default=None, metavar="CLIP", help="reference clip uploaded with each request")
    ref.add_argument("--ref-path", default=None, metavar="PATH",
                     help="a ref_audio_path on the server (inside its --reference-dir) instead of an upload")
    work.add_argument("--prompt-text", default=None, help="the reference's transcript (default: the built-in clip's)")
    work.add_argument("--prompt-lang", default="zh")
    work.add_argument("--voice", default=None,
                      help="saved voice for --endpoint speech (default: save the reference as a voice for "
                           "this run, deleted after it)")
    work.add_argument("--seed", type=int, default=1)
    work.add_argument("--field", type=_field, action="append", default=[], metavar="NAME=VALUE",
                      help="another request field (repeatable), e.g. --field top_k=5 --field parallel_infer=false")
    mix = parser.add_argument_group("product workload (--mix): what a shared demo or an API deployment sees")
    mix.add_argument("--mix", action="store_true",
                     help="each client uploads its own clip (a --ref-dir clip made unique per client), requests "
                          "rotate through Mandarin, English and Japanese texts and through streamed and whole-file "
                          "answers; the report breaks the figures down per mode and language")
    mix.add_argument("--ref-dir", default=None, metavar="DIR",
                     help="folder of WAV clips with a manifest.json (clips: file, text, language) "
                          "(default ../shared/refset)")
    mix.add_argument("--mix-languages", type=_names, default=None, metavar="LANG[,LANG...]",
                     help="languages to rotate through (default zh,en,ja)")
    mix.add_argument("--mix-modes", type=_modes, default=(2, 0), metavar="MODE[,MODE...]",
                     help="streaming modes to rotate through (default 2,0: token-chunk streams and whole files)")
    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the report as JSON instead of the table")
    out.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    out.add_argument("--out", default=None, metavar="FILE.json", help="also write the JSON report here")
    out.add_argument("--png", default=None, metavar="FILE.png",
                     help="draw first-chunk latency and total throughput against clients (needs matplotlib)")


def run(args: argparse.Namespace) -> int:
    from studio.loadtest import REF_TEXT, TEXT, LoadConfig, LoadTestError, draw_png, format_table, run_load

    def read(path: str, flag: str) -> bytes:
        try:
            return Path(path).read_bytes()
        except OSError as e:
            raise LoadTestError(f"{flag}: cannot read {path} ({e.strerror or e})") from None

    mix = None
    if args.mix:
        from studio.loadtest.mix import DEFAULT_REF_DIR, load_mix

        if args.text or args.ref or args.ref_path or args.prompt_text is not None or args.endpoint != "tts":
            raise LoadTestError("--mix brings its own texts and a clip per client: drop --text, --ref, --ref-path, "
                                "--prompt-text and --endpoint speech (or drop --mix)")
        mix = load_mix(args.ref_dir or DEFAULT_REF_DIR, args.mix_languages, args.mix_modes)
    elif args.ref_dir or args.mix_languages:
        raise LoadTestError("--ref-dir and --mix-languages belong to the product workload: add --mix")
    text = args.text or TEXT
    text = read(text[1:], "--text").decode("utf-8") if text.startswith("@") else text
    ref_audio = read(args.ref, "--ref") if args.ref else None
    duration = args.duration if args.duration is not None or args.requests is not None else 30.0
    cfg = LoadConfig(url=args.url, endpoint=args.endpoint, clients=args.clients, rate=args.rate,
                     duration_s=duration, requests=args.requests, timeout_s=args.timeout, warmup=args.warmup,
                     text=text, text_lang=args.text_lang, streaming_mode=args.streaming_mode,
                     ref_audio=ref_audio, ref_path=args.ref_path,
                     prompt_text=args.prompt_text if args.prompt_text is not None else REF_TEXT,
                     prompt_lang=args.prompt_lang, voice=args.voice, seed=args.seed, fields=tuple(args.field), mix=mix)
    report = run_load(cfg, log=lambda s: print(s, file=sys.stderr, flush=True))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2, ensure_ascii=False), encoding="utf-8")
    if args.png:
        print(draw_png(report, args.png), file=sys.stderr)
    print(json.dumps(report, indent=2, ensure_ascii=False) if args.json else format_table(report, args.markdown))
    if not any(level["completed"] for level in report["levels"]):
        print("error: no request succeeded (see errors and error_messages in the report)", file=sys.stderr)
        return 1
    return 0
