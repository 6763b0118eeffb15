"""T2S on the CPU: fp32 (exact), bf16 and int8 dynamic quantisation, with token agreement.

    python benchmarks/t2s_cpu.py [--tokens 100] [--threads N]

Random full-size v2 T2S weights; batch 1; EOS disabled; greedy tokens compared with fp32.
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
from engine.t2s.decoding import SamplingParams, StopRules, T2SDecoder, T2SInput  # noqa: E402
from engine.t2s.fast import FastT2S  # noqa: E402
from engine.t2s.quantize import quantize_t2s_int8  # noqa: E402
from engine.testweights.t2s import random_t2s_model  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    item = T2SInput(torch.randint(1, 732, (40,), generator=g), torch.randn(1024, 40, generator=g))
    prompt = torch.randint(0, 1024, (100,), generator=g)
    rules = StopRules(early_stop_num=args.tokens - 1, min_steps=10**9)
    greedy = SamplingParams(top_k=1, repetition_penalty=1.35)
    base = random_t2s_model(T2SDims(), seed=0)
    variants = {
        "reference loop fp32": lambda: (lambda: T2SDecoder(base).decode_naive(item, prompt, greedy, rules)),
        "fast fp32": lambda: (lambda f=FastT2S(base, attention="sdpa"): f.decode_naive(item, prompt, greedy, rules)),
        "fast bf16": lambda: (lambda f=FastT2S(random_t2s_model(T2SDims(), seed=0).to(torch.bfloat16), attention="sdpa"):
                              f.decode_naive(item, prompt, greedy, rules)),
        "fast int8 dynamic": lambda: (lambda f=FastT2S(quantize_t2s_int8(base), attention="sdpa"):
                                      f.decode_naive(item, prompt, greedy, rules)),
    }
    ref_tokens = None
    print(json.dumps({"threads": torch.get_num_threads(), "torch": torch.__version__, "tokens": args.tokens}))
    for name, make in variants.items():
        fn = make()
        t0 = time.perf_counter()
        out = fn()
        first = time.perf_counter() - t0
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        tokens = out.tokens
        if ref_tokens is None:
            ref_tokens = tokens
        n = min(len(tokens), len(ref_tokens))
        agree = float((tokens[:n] == ref_tokens[:n]).float().mean())
        diverge = next((i for i in range(n) if tokens[i] != ref_tokens[i]), n)
        print(json.dumps({"variant": name, "tokens_per_s": round(args.tokens / med, 1), "first_call_s": round(first, 2),
                          "agreement_with_fp32": round(agree, 4), "first_divergence": diverge}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
