"""The batch-1 T2S decode on 2 and 1 intra-op threads, with libgomp's spin or passive OpenMP waits.

    python benchmarks/t2s_threads.py [--tokens 60] [--processes 2]

Each policy (``OMP_WAIT_POLICY`` unset = libgomp's spin, or ``PASSIVE``) runs in child processes of its own,
the policies alternating; inside a child, 2 and 1 intra-op threads alternate, twice each. Full-size random v2
T2S, the reference loop (``T2SDecoder.decode_naive``), fp32, a 225-position prefix (100 phones + 125 prompt
tokens), greedy; tokens/s of the steps after the prefill (a 1-token decode's time is taken off).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(tokens: int) -> dict:
    sys.path.insert(0, str(ROOT))
    import torch

    from engine.models.t2s import T2SDims
    from engine.t2s.decoding import SamplingParams, StopRules, T2SDecoder, T2SInput
    from engine.testweights.t2s import random_t2s_model

    g = torch.Generator().manual_seed(0)
    item = T2SInput(torch.randint(1, 732, (100,), generator=g), torch.randn(1024, 100, generator=g))
    prompt = torch.randint(0, 1024, (125,), generator=g)
    greedy = SamplingParams(top_k=1, repetition_penalty=1.35)
    decoder = T2SDecoder(random_t2s_model(T2SDims(), seed=0))

    def decode(n: int) -> float:
        t0 = time.perf_counter()
        decoder.decode_naive(item, prompt, greedy, StopRules(early_stop_num=n - 1, min_steps=10**9))
        return time.perf_counter() - t0

    decode(5)
    out: dict[str, list[float]] = {}
    for threads in (2, 1, 2, 1):
        torch.set_num_threads(threads)
        prefill = decode(1)
        out.setdefault(str(threads), []).append(round((tokens - 1) / (decode(tokens) - prefill), 1))
    return {"tokens_per_s_by_threads": out, "load": round(os.getloadavg()[0], 2)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=60)
    p.add_argument("--processes", type=int, default=2, help="child processes per policy")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.tokens)))
        return 0
    print(json.dumps({"nproc": os.cpu_count()}))
    for _ in range(args.processes):
        for policy in ("PASSIVE", "default"):
            env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
            if policy != "default":
                env["OMP_WAIT_POLICY"] = policy
            out = subprocess.run([sys.executable, __file__, "--child", "--tokens", str(args.tokens)], env=env,
                                 capture_output=True, text=True, check=True)
            print(json.dumps({"policy": policy, **json.loads(out.stdout.strip().splitlines()[-1])}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
