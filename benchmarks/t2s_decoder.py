"""T2S decoder benchmark: builds, checks and times the decoder variants in one run.

    python benchmarks/t2s_decoder.py [--device cuda] [--tokens 500] [--json OUT.json]

Random full-size v2 T2S weights (the official 24x512 model). Batch 1 decodes a fixed number of
tokens (EOS disabled); batched rows decode the same number each. Prints a table; warm-up excluded
(and reported), medians of repeated runs.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.models.t2s import T2SDims  # noqa: E402
from engine.t2s.decoding import SamplingParams, StopRules, T2SDecoder, T2SInput  # noqa: E402
from engine.t2s.fast import FastT2S  # noqa: E402
from engine.testweights.t2s import random_t2s_model  # noqa: E402

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_inputs(batch: int, n_phones: int = 60, n_prompt: int = 150, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    items = [T2SInput(torch.randint(1, 732, (n_phones - 3 * i % 7,), generator=g),
                      torch.randn(1024, n_phones - 3 * i % 7, generator=g)) for i in range(batch)]
    prompt = torch.randint(0, 1024, (n_prompt,), generator=g)
    return items, prompt


def timed(fn, device, repeats: int) -> tuple[float, float, object]:
    """(first call seconds, median seconds of the next `repeats` calls, last result)."""
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times), out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokens", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", default="8,32,64")
    ap.add_argument("--dtypes", default="fp16,bf16,fp32")
    ap.add_argument("--skip-eager", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dev = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False  # as the official set_seed does
    env = {"torch": torch.__version__, "device": str(dev), "python": platform.python_version(),
           "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor(),
           "threads": torch.get_num_threads()}
    print(json.dumps(env))
    base = random_t2s_model(T2SDims(), seed=0)
    n = args.tokens
    rules = StopRules(early_stop_num=n - 1, min_steps=10**9)  # EOS banned: exactly n tokens
    greedy, sampled = SamplingParams(top_k=1), SamplingParams(top_k=15, top_p=0.9, temperature=0.8)
    rows: list[dict] = []

    def record(name: str, dtype: str, batch: int, first: float, med: float, tokens: int, **extra) -> None:
        row = {"variant": name, "dtype": dtype, "batch": batch, "tokens_per_row": tokens,
               "first_call_s": round(first, 3), "median_s": round(med, 4),
               "tokens_per_s": round(batch * tokens / med, 1), "ms_per_step": round(1000 * med / tokens, 3), **extra}
        rows.append(row)
        print(json.dumps(row), flush=True)

    items1, prompt = make_inputs(1)
    # --- correctness in fp32: eager reference vs fast (graph on CUDA), greedy ---------------------------
    m32 = base.to(dev, torch.float32)
    check_rules = StopRules(early_stop_num=199, min_steps=10**9)
    ref = T2SDecoder(m32).decode_naive(items1[0], prompt, greedy, check_rules)
    items8, _ = make_inputs(8)
    ref_b = T2SDecoder(m32).decode_batch(items8, prompt, greedy, check_rules)
    for attention in (("sdpa", "triton") if dev.type == "cuda" else ("sdpa",)):
        fast32 = FastT2S(m32, attention=attention)
        got = fast32.decode_naive(items1[0], prompt, greedy, check_rules)
        same = torch.equal(ref.tokens.cpu(), got.tokens.cpu())
        print(json.dumps({"check": f"fp32 greedy fast[{attention}] == reference (200 tokens)", "ok": same}), flush=True)
        got_b = fast32.decode_batch(items8, prompt, greedy, check_rules)
        same_b = all(torch.equal(a.tokens.cpu(), b.tokens.cpu()) for a, b in zip(ref_b, got_b))
        print(json.dumps({"check": f"fp32 greedy batch-8 fast[{attention}] == reference", "ok": same_b}), flush=True)
    ref_tokens = ref.tokens.cpu()
    del fast32

    for dname in args.dtypes.split(","):
        dt = DTYPES[dname]
        if dev.type == "cpu" and dt == torch.float16:
            continue
        model = random_t2s_model(T2SDims(), seed=0).to(dev, dt)
        if dname != "fp32":  # greedy agreement of the fastest path with the fp32 reference
            got = FastT2S(model).decode_naive(items1[0], prompt, greedy, check_rules).tokens.cpu()
            k = min(len(got), len(ref_tokens))
            diverge = next((i for i in range(k) if got[i] != ref_tokens[i]), k)
            print(json.dumps({"check": f"{dname} greedy agreement with fp32", "first_divergence": diverge,
                              "equal_fraction": round(float((got[:k] == ref_tokens[:k]).float().mean()), 4)}), flush=True)
        if not args.skip_eager:
            f, med, _ = timed(lambda model=model: T2SDecoder(model).decode_naive(items1[0], prompt, greedy, rules), dev, 1)
            record("eager (reference loop)", dname, 1, f, med, n)
        for attention in (("sdpa", "triton") if dev.type == "cuda" else ("sdpa",)):
            fast = FastT2S(model, sync_every=32, attention=attention)
            f, med, _ = timed(lambda: fast.decode_naive(items1[0], prompt, greedy, rules), dev, args.repeats)
            record(f"fast graph={fast.use_graph} attention={attention}", dname, 1, f, med, n)
        f, med, _ = timed(lambda: fast.decode_naive(items1[0], prompt, sampled, rules, torch.Generator(dev).manual_seed(1)),
                          dev, args.repeats)
        record("fast, top-k/top-p sampling", dname, 1, f, med, n)
        if dname == "fp16" or dev.type == "cpu":
            for b in [int(x) for x in args.batches.split(",") if x]:
                items, _ = make_inputs(b)
                fb = FastT2S(model, sync_every=32)  # best attention for the device
                f, med, _ = timed(lambda: fb.decode_batch(items, prompt, sampled, rules,
                                                          torch.Generator(dev).manual_seed(2)), dev, 2)
                record("fast batched", dname, b, f, med, n)
        del model
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if dev.type == "cuda":
        print(json.dumps({"peak_device_memory_gb": round(torch.cuda.max_memory_allocated(dev) / 1e9, 2)}))
    if args.json:
        Path(args.json).write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    print("\nvariant | dtype | batch | tokens/s | ms/step | first call s")
    for r in rows:
        print(f"{r['variant']} | {r['dtype']} | {r['batch']} | {r['tokens_per_s']} | {r['ms_per_step']} | {r['first_call_s']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
