"""Where does a T2S decode step spend its time? Times FastT2S variants and profiles the graph replay.

    python benchmarks/t2s_step_profile.py [--tokens 500] [--compile]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.models.t2s import T2SDims  # noqa: E402
from engine.t2s.decoding import SamplingParams, StopRules, T2SInput  # noqa: E402
from engine.t2s.fast import FastT2S  # noqa: E402
from engine.testweights.t2s import random_t2s_model  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=500)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--dtype", default="fp16")
    args = ap.parse_args()
    dev = torch.device("cuda")
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    model = random_t2s_model(T2SDims(), seed=0).to(dev, dt)
    g = torch.Generator().manual_seed(0)
    item = T2SInput(torch.randint(1, 732, (60,), generator=g), torch.randn(1024, 60, generator=g))
    prompt = torch.randint(0, 1024, (150,), generator=g)
    rules = StopRules(early_stop_num=args.tokens - 1, min_steps=10**9)
    params = SamplingParams(top_k=15, top_p=0.9, temperature=0.8)
    variants = [("sdpa", dict(attention="sdpa")), ("triton", dict(attention="triton"))]
    if args.compile:
        variants.append(("triton+compile", dict(attention="triton", compile_step=True)))
    best = None
    for name, kw in variants:
        fast = FastT2S(model, sync_every=32, **kw)
        t0 = time.perf_counter()
        fast.decode_naive(item, prompt, params, rules)
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        times = []
        for _ in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fast.decode_naive(item, prompt, params, rules)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        row = {"variant": name, "dtype": args.dtype, "first_call_s": round(first, 2),
               "tokens_per_s": round(args.tokens / med, 1), "ms_per_step": round(1000 * med / args.tokens, 3)}
        print(json.dumps(row), flush=True)
        if best is None or med < best[1]:
            best = (fast, med, name)
    fast, _, name = best
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        fast.decode_naive(item, prompt, params, rules)
        torch.cuda.synchronize()
    print(f"profile of one {args.tokens}-token decode with {name}:")
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    sys.exit(main())
