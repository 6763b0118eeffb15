"""``serve`` under N concurrent streaming clients: total audio rate against one client alone, first-chunk
latency, and whether every answer equals the same request sent alone. Prints a table and JSON.

Starts ``sovits-studio serve`` on a free port as a child process, over a
tiny random v2 model set (written here with ``engine.testweights``) unless ``--config`` is given, and
streams ``/tts`` with ``streaming_mode=2`` (token chunks), a fixed seed per client and an uploaded clip.

    python benchmarks/serving_http.py --clients 8 --device cpu
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["The quick brown fox jumps over the lazy dog, and then it runs far away into the forest.",
         "It was a bright cold day in April, and the clocks were striking thirteen.",
         "Call me Ishmael. Some years ago, never mind how long precisely, I went to sea.",
         "All happy families are alike; each unhappy family is unhappy in its own way.",
         "In a hole in the ground there lived a hobbit, not a nasty dirty wet hole.",
         "Far out in the uncharted backwaters of the unfashionable end of the spiral arm.",
         "The sky above the port was the color of television, tuned to a dead channel.",
         "Many years later, as he faced the firing squad, he remembered that afternoon."]


def clip_wav() -> bytes:
    import soundfile as sf

    rate = 24000
    t = np.arange(4 * rate) / rate
    x = 0.3 * np.sin(2 * np.pi * 140 * t) * (0.5 * (1 + np.sin(2 * np.pi * 4 * t))) ** 2
    x = x + 0.01 * np.random.default_rng(0).standard_normal(t.shape)
    buf = io.BytesIO()
    sf.write(buf, x.astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def stream(url: str, text: str, seed: int, ref: bytes, out: dict) -> None:
    import httpx

    data = {"text": text, "text_lang": "en", "prompt_lang": "en", "prompt_text": "Yesterday I walked to the old "
            "library and borrowed three books.", "streaming_mode": "2", "seed": str(seed), "media_type": "raw",
            "text_split_method": "cut5"}
    t0 = time.perf_counter()
    body, first = bytearray(), None
    with httpx.stream("POST", f"{url}/tts", data=data, files={"ref_audio": ("ref.wav", ref, "audio/wav")},
                      timeout=600) as r:
        if r.status_code != 200:
            out["error"] = f"{r.status_code} {r.read()[:200]!r}"
            return
        for chunk in r.iter_bytes():
            if first is None and chunk:
                first = time.perf_counter() - t0
            body += chunk
    out.update(first=first, wall=time.perf_counter() - t0, audio=len(body) / 2 / 32000, body=bytes(body))


def run_clients(url: str, n: int, ref: bytes, first: int = 0) -> tuple[list[dict], float]:
    """Clients ``first .. first + n - 1`` at once; client i reads TEXTS[i] with seed 100 + i."""
    outs = [dict() for _ in range(n)]
    threads = [threading.Thread(target=stream, args=(url, TEXTS[(first + i) % len(TEXTS)], 100 + first + i, ref,
                                                     outs[i])) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outs, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="", help="a tts_infer.yaml (default: tiny random v2 weights)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-tokens", type=int, default=150, help="the server's --max-tokens-per-sentence")
    args = ap.parse_args()
    config = args.config
    if not config:
        from engine.testweights import make_test_weights

        config = str(make_test_weights(Path(tempfile.mkdtemp(prefix="serving-http-")) / "v2", "v2"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cli = "import sys; from studio.cli import main; sys.exit(main(sys.argv[1:]))"
    server = subprocess.Popen([sys.executable, "-c", cli, "serve", "--config", config, "--device",
                               args.device, "--port", str(port), "--max-queue", "64", "--max-tokens-per-sentence",
                               str(args.max_tokens)], env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        import httpx

        for _ in range(600):
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        ref = clip_wav()
        run_clients(url, 1, ref, first=999)  # warm-up
        alone = []
        for i in range(args.clients):  # each request alone: the reference answers, and the one-client rate
            alone.append(run_clients(url, 1, ref, first=i)[0][0])
        one_rate = statistics_rate(alone)
        together, wall = run_clients(url, args.clients, ref)
        errors = [o.get("error") for o in together if "error" in o] + [o.get("error") for o in alone if "error" in o]
        equal = [a.get("body") == b.get("body") for a, b in zip(alone, together)]
        total_rate = sum(o.get("audio", 0.0) for o in together) / wall
        firsts_alone = sorted(o["first"] for o in alone if o.get("first") is not None)
        firsts = sorted(o["first"] for o in together if o.get("first") is not None)
        report = {"clients": args.clients, "one_client_audio_s_per_s": one_rate,
                  "concurrent_audio_s_per_s": total_rate, "ratio": total_rate / one_rate if one_rate else None,
                  "answers_equal_to_alone": sum(equal), "errors": errors,
                  "first_chunk_alone_median_s": firsts_alone[len(firsts_alone) // 2] if firsts_alone else None,
                  "first_chunk_concurrent_median_s": firsts[len(firsts) // 2] if firsts else None,
                  "first_chunk_concurrent_max_s": firsts[-1] if firsts else None,
                  "audio_s_per_client": [round(o.get("audio", 0.0), 2) for o in together]}
        print("| clients | one client: audio s/s | all clients: audio s/s | ratio | answers equal to alone | "
              "first chunk alone / concurrent median / max (s) |")
        print("|---|---|---|---|---|---|")
        print(f"| {args.clients} | {one_rate:.2f} | {total_rate:.2f} | {report['ratio']:.2f}x | "
              f"{sum(equal)}/{args.clients} | {report['first_chunk_alone_median_s']:.2f} / "
              f"{report['first_chunk_concurrent_median_s']:.2f} / {report['first_chunk_concurrent_max_s']:.2f} |")
        print(json.dumps(report))
    finally:
        server.terminate()
        server.wait(timeout=30)


def statistics_rate(outs: list[dict]) -> float:
    """One client's audio rate: audio seconds over wall seconds, summed over its sequential requests."""
    ok = [o for o in outs if "audio" in o]
    return sum(o["audio"] for o in ok) / sum(o["wall"] for o in ok) if ok else 0.0


if __name__ == "__main__":
    main()
