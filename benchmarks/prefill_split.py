"""Where a serving prefill's time goes: the slot decoder's prefill (engine.serving.slots.SlotDecoder.prefill) on
random full-size v2 T2S weights, rows of new prefix widths each time, as the scheduler meets them.

For each setting (PyTorch's default attention; cuDNN's attention off, as the server runs it; then the captured
prefills of engine.serving.slots, every bucket captured first and the capture timed) and each row count: the median time of a prefill at a width not met before and of a repeat at a met width, then one
prefill at a new width under the torch profiler, its heaviest operators by device and by host time.

    python benchmarks/prefill_split.py [--rows 1,4,16] [--prefills 12] [--device cuda]

A prefill at a new width that costs far more than a repeat means a per-shape cost (a plan, an autotune); one whose
host time exceeds its device time means launches and copies, which a CUDA graph or fewer kernels would answer.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,4,16", help="rows per prefill")
    ap.add_argument("--prefills", type=int, default=12, help="prefills at new widths per setting")
    ap.add_argument("--prompt", type=int, default=150, help="reference prompt tokens (about 6 s of a clip)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny weights (a check of the script on the CPU)")
    args = ap.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from engine.models.t2s import T2SDims
    from engine.serving.slots import SlotDecoder
    from engine.t2s.decoding import SamplingParams, T2SInput
    from engine.testweights.t2s import random_t2s_model

    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    dtype = torch.float16 if cuda else torch.float32
    dims = T2SDims(n_layer=2, n_head=2, hidden_dim=32, embedding_dim=32) if args.tiny else T2SDims()
    model = random_t2s_model(dims, seed=0).to(dev, dtype).eval()
    decoder = SlotDecoder(model, slots=64, capacity=2048)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 1024, (args.prompt,), generator=g)
    params = SamplingParams(top_k=15, top_p=1.0, temperature=1.0)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    name = torch.cuda.get_device_name(dev) if cuda else "cpu"
    print(f"{name}, torch {torch.__version__}, {dims.n_layer} layers x {dims.hidden_dim}, {dtype}, "
          f"prompt {args.prompt} tokens", flush=True)
    width = [40]  # phones of the next row: every prefill meets a width of its own

    def rows_of(n: int, fresh: bool) -> list:
        if fresh:
            width[0] += 3
        return [T2SInput(torch.randint(1, 700, (width[0] + i,), generator=g),
                         torch.randn(dims.bert_dim, width[0] + i, generator=g))
                for i in range(n)]

    def prefill(items: list) -> float:
        n = len(items)
        sync()
        t0 = time.perf_counter()
        decoder.prefill(list(range(n)), items, [prompt] * n, [params] * n, [0] * n, list(range(n)))
        sync()
        return time.perf_counter() - t0

    prefill(rows_of(1, True))  # the first call of the process (kernels loaded) is not a serving prefill
    choices = [("default", None)]
    if cuda:
        choices += [("cuDNN attention off", False), ("captured prefills", False)]
    for label, cudnn in choices:
        if cudnn is not None:
            torch.backends.cuda.enable_cudnn_sdp(cudnn)
        if label == "captured prefills":
            buckets = {decoder.prefill_bucket(int(r), w) for r in args.rows.split(",") + ["4"]
                       for w in range(64, 1025, 64)} - {None}  # prefixes to 1,024 positions
            sync()
            t0 = time.perf_counter()
            decoder.capture_prefills(sorted(buckets))
            sync()
            print(f"captured {len(buckets)} prefill buckets in {time.perf_counter() - t0:.2f} s "
                  f"(memory allocated {torch.cuda.memory_allocated(dev) / 2**20:.0f} MiB)", flush=True)
        for n in (int(r) for r in args.rows.split(",")):
            firsts, repeats = [], []
            for _ in range(args.prefills):
                items = rows_of(n, True)
                firsts.append(prefill(items))
                repeats.append(prefill(items))
            print(f"{label:20s} rows {n:3d}: new width {1e3 * statistics.median(firsts):7.2f} ms "
                  f"(max {1e3 * max(firsts):7.2f}), repeat {1e3 * statistics.median(repeats):7.2f} ms", flush=True)
        items = rows_of(4, True)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities) as prof:
            prefill(items)
        key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
        print(f"-- {label}: one prefill of 4 rows at a new width, by device time", flush=True)
        print(prof.key_averages().table(sort_by=key, row_limit=12), flush=True)
        if cuda:
            print(f"-- {label}: the same, by host time", flush=True)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
