"""The cluster with 1 vs N replicas on this machine: throughput and latency of `/tts` under concurrent clients.

    python benchmarks/cluster.py -c CONFIG [--replicas 1 2] [--clients 4] [--requests 16] [--num-cpus 2]

Each run starts a local Ray with ``--num-cpus`` CPUs and splits them evenly between the replicas (1 replica
of 2 CPUs vs 2 replicas of 1 CPU: the same machine, used by one engine or by two). Every request is the same
short sentence with a fixed seed and a token cap (random weights rarely say EOS); the first round (one
request per client) loads and warms the replicas and is not timed. Prints one JSON line per run and a table.
Needs the [cluster] extra. Make weights with `sovits-studio make-test-weights DIR --version v2 --full-size`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def run_once(args: argparse.Namespace, replicas: int, ref: Path) -> dict:
    import httpx

    from studio.cluster.config import ClusterConfig
    from studio.cluster.launch import deploy

    config = ClusterConfig.load(None, {
        "infer_config": args.config, "replicas": replicas, "cpus_per_replica": args.num_cpus / replicas,
        "num_cpus": args.num_cpus, "object_store_mb": 200, "port": args.port, "reference_dirs": [str(ref.parent)],
        "max_tokens_per_sentence": args.tokens, "voices_dir": "", "workers": args.workers})
    t0 = time.perf_counter()
    cluster = deploy(config, quiet=True)
    started = time.perf_counter() - t0
    params = {"text": args.text, "text_lang": "en", "ref_audio_path": str(ref), "prompt_text": "Hello there.",
              "prompt_lang": "en", "seed": 7, "text_split_method": "cut0"}
    latencies: list[float] = []

    def one(_: int) -> tuple[float, str]:
        t = time.perf_counter()
        r = httpx.get(f"{cluster.url}/tts", params=params, timeout=600)
        r.raise_for_status()
        return time.perf_counter() - t, r.headers["x-sovits-replica"]

    try:
        with ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(one, range(args.clients)))  # load and warm every replica
            t = time.perf_counter()
            results = list(pool.map(one, range(args.requests)))
            wall = time.perf_counter() - t
    finally:
        cluster.stop()
    latencies = sorted(r[0] for r in results)
    return {"replicas": replicas, "cpus_per_replica": args.num_cpus / replicas, "workers": args.workers,
            "clients": args.clients,
            "requests": args.requests, "start_s": round(started, 1), "wall_s": round(wall, 2),
            "requests_per_s": round(args.requests / wall, 3), "p50_s": round(statistics.median(latencies), 2),
            "p95_s": round(latencies[int(0.95 * (len(latencies) - 1))], 2),
            "replicas_used": len({r[1] for r in results}),
            "load_avg_1m": round(os.getloadavg()[0], 1)}  # other work on the machine skews every figure


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-c", "--config", required=True, help="tts_infer.yaml of the weights")
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--workers", type=int, default=1, help="syntheses computed at once per replica")
    ap.add_argument("--tokens", type=int, default=100, help="semantic tokens per sentence (4 s of audio)")
    ap.add_argument("--text", default="The quick brown fox jumps over the lazy dog.")
    ap.add_argument("--port", type=int, default=9890)
    args = ap.parse_args()
    import tempfile

    from tests.support.server import reference_wav

    with tempfile.TemporaryDirectory() as tmp:
        ref = Path(tmp) / "ref.wav"
        ref.write_bytes(reference_wav(0))
        rows = []
        for n in args.replicas:
            rows.append(run_once(args, n, ref))
            print(json.dumps(rows[-1]), flush=True)
    print("\n| replicas x CPUs | workers | requests/s | p50 latency (s) | p95 latency (s) | load avg |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['replicas']} x {r['cpus_per_replica']:g} | {r['workers']} | {r['requests_per_s']} | {r['p50_s']} "
              f"| {r['p95_s']} | {r['load_avg_1m']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
