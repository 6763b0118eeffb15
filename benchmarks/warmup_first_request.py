"""First /tts after "ready" against the second: does the start-up warm-up take the loading off the first request?

    PYTHONPATH=$PWD python benchmarks/warmup_first_request.py [--version v2] [--tokens 12] [--no-warmup] [--busy]
        [--text "Hello world, 12 apples. 你好世界。" --text-lang auto]

Writes a tiny random model set (engine.testweights), starts `sovits-studio serve` on it as a user would,
waits for /health to say "ready", then times three /tts requests: the first, the same request again, and one
with another reference clip. The reference cache is off unless ``--reference-cache`` (otherwise the second
request would skip the reference features, which says nothing about warm-up). ``--busy`` keeps another
process loading every core (a matrix-multiply loop on all of them) while the server starts and serves, as on a
shared machine. ``--repeat N`` runs the whole measurement N times. Prints the times and ratios.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import soundfile as sf

REPO = Path(__file__).resolve().parents[1]


def clip(seed: int, seconds: float = 4.0, rate: int = 32000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    f0 = 120 + 15 * seed
    phase = 2 * np.pi * np.cumsum(f0 * (1 + 0.03 * np.sin(2 * np.pi * 5 * t))) / rate
    x = sum(np.sin(k * phase) / k for k in range(1, 8)) * (0.4 + 0.6 * np.sin(np.pi * 2.5 * t) ** 2)
    x = 0.3 * x / np.abs(x).max() + 0.002 * np.random.default_rng(seed).standard_normal(t.size)
    buf = io.BytesIO()
    sf.write(buf, x.astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", default="v2")
    ap.add_argument("--tokens", type=int, default=12, help="semantic tokens per sentence (random weights)")
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--text", default="Hello there, how are you today?",
                    help="the requests' text (numbers and other languages load their readers on first use)")
    ap.add_argument("--text-lang", default="en")
    ap.add_argument("--reference-cache", action="store_true",
                    help="keep the reference cache on (then the second request skips the reference features)")
    ap.add_argument("--busy", action="store_true", help="another process keeps every core busy meanwhile")
    ap.add_argument("--repeat", type=int, default=1, help="measure this many times (a fresh server each time)")
    args = ap.parse_args()
    load = _busy_process() if args.busy else None
    try:
        return max(measure(args) for _ in range(args.repeat))
    finally:
        if load is not None:
            load.terminate()
            load.wait(10)


def _busy_process() -> subprocess.Popen:
    """A process whose matrix multiplications keep every core busy until it is stopped."""
    code = ("import os, torch\ntorch.set_num_threads(os.cpu_count())\na = torch.randn(768, 768)\n"
            "while True:\n    a = torch.tanh(a @ a)\n")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measure(args) -> int:
    from engine.testweights import make_test_weights

    root = Path(tempfile.mkdtemp(prefix="warmup-bench-"))
    config = make_test_weights(root, args.version)
    (root / "ref0.wav").write_bytes(clip(0))
    (root / "ref1.wav").write_bytes(clip(1))
    port = 18000 + os.getpid() % 1000
    cmd = [sys.executable, "-c", "import sys; from studio.cli import main; sys.exit(main(sys.argv[1:]))", "serve", "-c", str(config), "-p", str(port), "-a", "127.0.0.1",
           "--reference-dir", str(root), "--max-tokens-per-sentence", str(args.tokens)]
    if args.no_warmup:
        cmd.append("--no-warmup")
    if not args.reference_cache:  # the comparison is about warm-up, not about the cache serving request 2
        cmd += ["--reference-cache-entries", "0"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).json()["status"] == "ready":
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None:
                print(proc.stderr.read()[-3000:])
                return 1
            time.sleep(0.1)
        ready = time.monotonic() - start

        def tts(ref: str) -> float:
            t0 = time.monotonic()
            r = httpx.post(f"{url}/tts", json={"text": args.text, "text_lang": args.text_lang,
                                               "ref_audio_path": ref, "prompt_text": "The weather is nice today.",
                                               "prompt_lang": "en", "seed": 1}, timeout=300)
            r.raise_for_status()
            return time.monotonic() - t0

        first, second, other = tts("ref0.wav"), tts("ref0.wav"), tts("ref1.wav")
        print(f"{args.version} tiny, warm-up {'off' if args.no_warmup else 'on'}, {'busy' if args.busy else 'idle'} "
              f"machine, reference cache "
              f"{'on' if args.reference_cache else 'off'}: ready after {ready:.2f} s; "
              f"first /tts {first:.3f} s, second (same request) {second:.3f} s, third (other reference) "
              f"{other:.3f} s; first/second = {first / second:.2f}, first/third = {first / other:.2f}")
        return 0
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    sys.exit(main())
