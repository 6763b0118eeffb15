"""What the HTTP server itself costs the engine's interpreter: its CPU time per second of audio delivered, with
the model work taken out.

The server is the real one (``studio.http.create_app``: the guard, body limits, multipart uploads, admission, the
worker pool, the stream producer, WAV/PCM encoding, uvicorn) over a real :class:`engine.studio.Studio` whose
``synthesize`` is replaced by a null engine: it yields, at once, the pieces a request of ``--audio-s`` seconds
gives (token chunks of ``--chunk-tokens`` at 25 Hz for streams, one piece a sentence for whole files), silence
of the right length. The client is the product workload (``loadtest --mix``: a clip of its own per client,
Mandarin / English / Japanese, streams and whole files) on loopback, in this process.

Everything the server process does is then host work that would compete for the engine's GIL in one
interpreter. The benchmark reads the server's CPU time (user + system, from the OS, so a busy machine changes
it little) before and after each level and prints, per level, the CPU milliseconds per second of audio and per
request, and the ceiling they imply: the audio-s/s at which the HTTP work alone would fill one core (what a
single interpreter can give the engine before its GIL, not the card, is the limit).

    python benchmarks/http_host_cost.py --levels 1,16,64 --duration 10 --json docs/bench/http_host_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RATE = 32000  # v2 output
TOKEN_RATE = 25  # semantic tokens a second (25 Hz)


def null_synthesize(audio_s: float, chunk_tokens: int, front_end=None):
    """A ``Studio.synthesize`` that does no model work: the pieces a request of ``audio_s`` seconds gives.
    ``front_end``: a VoiceCloner whose text front end (sentence split, normalisation, g2p; not BERT) reads each
    request's text first, as the engine's request threads do."""
    import numpy as np

    from engine.results import Result

    def synthesize(text, text_lang, reference, options, gpt=None, sovits=None, on_progress=None):
        if front_end is not None:
            for sentence in front_end.split(text, text_lang, options):
                front_end.frontend.phones_and_bert(sentence, text_lang, with_bert=False)
        total = int(audio_s * RATE)
        step = int(chunk_tokens * RATE / TOKEN_RATE) if options.streaming_mode else -(-total // 3)
        sizes = [min(step, total - at) for at in range(0, total, step)]
        for i, n in enumerate(sizes):
            yield Result(np.zeros(n, dtype=np.float32), RATE, text, (1, 2, 3), i, 0 if options.streaming_mode else i,
                         i == len(sizes) - 1, int(options.seed))

    return synthesize


def serve(port: int, audio_s: float, chunk_tokens: int, front_end: bool) -> None:
    """The server process: tiny random v2 weights, the real app, the null engine."""
    import uvicorn

    from engine.studio import Studio
    from engine.testweights import make_test_weights
    from studio.http.app import create_app

    folder = Path(tempfile.mkdtemp(prefix="http-host-cost-"))
    config = make_test_weights(folder, "v2")
    studio = Studio.from_config(config, device="cpu", precision="fp32")
    studio.synthesize = null_synthesize(audio_s, chunk_tokens, studio.cloner() if front_end else None)
    app = create_app(studio)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def top_functions(collapsed: Path, n: int = 25) -> list[tuple[str, float]]:
    """The functions with the most samples at the top of the stack (own time), as shares of the busy samples,
    from py-spy's collapsed stacks (idle threads excluded: their top frames are waits)."""
    own: dict[str, int] = {}
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        top = stack.split(";")[-1]
        if any(w in top for w in ("wait (threading", "select (selectors", "_worker (concurrent", "get (queue",
                                  "acquire", "sleep")):
            continue
        own[top] = own.get(top, 0) + int(count)
        total += int(count)
    rows = sorted(own.items(), key=lambda kv: -kv[1])[:n]
    for name, count in rows:
        print(f"  {100 * count / max(total, 1):5.1f}%  {name}")
    return [(name, count / max(total, 1)) for name, count in rows]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if json.loads(r.read()).get("status") == "ready":
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("the server did not get ready")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="1,16,64")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--audio-s", type=float, default=6.0, help="seconds of audio a request gives")
    ap.add_argument("--chunk-tokens", type=int, default=24, help="tokens a streamed chunk holds (25 Hz)")
    ap.add_argument("--front-end", action="store_true",
                    help="the null engine reads each text with the real front end (no BERT) first")
    ap.add_argument("--ref-dir", default=str(ROOT.parent / "shared" / "refset"))
    ap.add_argument("--json")
    ap.add_argument("--py-spy", help="sample the server with py-spy (on PATH) during the levels: collapsed stacks "
                    "to this file, and the top functions by own time printed")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the server process
    args = ap.parse_args()
    if args.serve:
        serve(args.serve, args.audio_s, args.chunk_tokens, args.front_end)
        return 0
    import psutil

    from studio.loadtest import LoadConfig, run_load
    from studio.loadtest.mix import load_mix

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--audio-s", str(args.audio_s),
                             "--chunk-tokens", str(args.chunk_tokens)] + ["--front-end"] * args.front_end, cwd=ROOT)
    report = {"args": vars(args), "cpus": os.cpu_count(), "levels": []}
    try:
        _wait_ready(url, proc)
        server = psutil.Process(proc.pid)
        mix = load_mix(args.ref_dir)
        # not counted: every language and mode once, so no level pays for the front end's first loads
        run_load(LoadConfig(url=url, clients=(2 * len(mix.texts) * len(mix.modes),), requests=4 * len(mix.texts)
                            * len(mix.modes), duration_s=None, timeout_s=120, warmup=0, mix=mix))
        print(f"null engine{' + text front end' if args.front_end else ''}, {args.audio_s:g} s of audio a request; load average {os.getloadavg()[0]:.1f}",
              flush=True)
        print("| clients | requests | audio s | server CPU s | CPU ms per audio s | CPU ms per request | "
              "one core full at (audio-s/s) |\n|---|---|---|---|---|---|---|", flush=True)
        for clients in (int(x) for x in args.levels.split(",")):
            cfg = LoadConfig(url=url, clients=(clients,), duration_s=args.duration, timeout_s=60, warmup=1,
                             mix=mix)
            spy = None
            if args.py_spy:
                spy = subprocess.Popen(["py-spy", "record", "--pid", str(proc.pid), "--format", "raw", "--threads",
                                        "--nonblocking", "-o", f"{args.py_spy}.{clients}", "--duration",
                                        str(int(args.duration))], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            before = server.cpu_times()
            level = run_load(cfg)["levels"][0]
            after = server.cpu_times()
            if spy is not None:
                spy.wait(60)
                report.setdefault("py_spy", {})[clients] = top_functions(Path(f"{args.py_spy}.{clients}"))
            cpu = (after.user - before.user) + (after.system - before.system)
            done = [s for s in level["streams"] if s["error"] is None]
            audio = sum(s["audio_s"] for s in done)
            row = {"clients": clients, "requests": len(done), "errors": len(level["streams"]) - len(done),
                   "audio_s": audio, "server_cpu_s": cpu, "cpu_ms_per_audio_s": 1e3 * cpu / max(audio, 1e-9),
                   "cpu_ms_per_request": 1e3 * cpu / max(len(done), 1), "load_average": os.getloadavg()[0]}
            row["one_core_at_audio_s_per_s"] = 1e3 / row["cpu_ms_per_audio_s"] if audio else 0.0
            report["levels"].append(row)
            print(f"| {clients} | {len(done)} | {audio:.0f} | {cpu:.2f} | {row['cpu_ms_per_audio_s']:.2f} | "
                  f"{row['cpu_ms_per_request']:.1f} | {row['one_core_at_audio_s_per_s']:.0f} |", flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
