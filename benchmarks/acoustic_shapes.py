"""What a streaming chunk's SoVITS decode costs when every call has a new length (as in serving: each chunk
re-encodes its sentence so far, and every sentence is another length), by convolution backend:

* ``cudnn``: PyTorch's default (cuDNN picks and builds an execution plan for every new shape);
* ``native``: cuDNN off for the call (PyTorch's own im2col + cuBLAS convolutions: no per-shape plan);
* ``cudnn-same``: cuDNN on one repeated shape (the plans cached: what a benchmark of one shape sees);
* ``cudnn-buckets``: cuDNN on new lengths padded to the scheduler's shape buckets (``buckets=True``): each
  bucket builds its plans once;
* ``graphs``: as ``cudnn-buckets`` through ``AcousticGraphs`` (what serving does on CUDA): a first pass over
  the calls' shapes runs eagerly and the shapes are captured, then the timed pass replays CUDA graphs. Also
  prints the largest difference between the graphs' audio and latents and the eager bucketed decode's.

Prints the median milliseconds per call, single and batched, and the largest difference between the
backends' audio (float32 and the chosen precision).

    python benchmarks/acoustic_shapes.py --device cuda --precision fp16 --calls 30
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def load(version: str, device: str, precision: str, root: Path):
    from engine.loading.sovits import load_sovits
    from engine.runtime import resolve_runtime
    from engine.testweights.sovits import write_sovits

    path = root / f"sovits_{version}.pth"
    if not path.exists():
        write_sovits(path, version, True)
    rt = resolve_runtime(device, precision)
    loaded = load_sovits(path, rt.device, rt.dtype_for("sovits"))
    return loaded.module.to(rt.device, rt.dtype_for("sovits")).eval()


def backend(name: str):
    return torch.backends.cudnn.flags(enabled=False) if name == "native" else contextlib.nullcontext()


def rows_for(sovits, lengths: list[int], seed: int) -> list[dict]:
    dev, dt = next(sovits.parameters()).device, next(sovits.parameters()).dtype
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        gin = sovits.dims.gin_channels
        out.append({"codes": torch.randint(0, 1024, (n,), generator=g).to(dev),
                    "text": torch.randint(1, 300, (max(8, n // 3),), generator=g).to(dev),
                    "ge": torch.randn(1, gin, 1, generator=g).to(dev, dt), "result_length": 20,
                    "overlap_frames": None, "generator": torch.Generator(device=dev).manual_seed(seed + n)})
    return out


def timed(fn, sync) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - t0) * 1000


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", default="v2ProPlus")
    p.add_argument("--device", default="cuda")
    p.add_argument("--precision", default="fp16")
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--modes", default="cudnn,native,cudnn-same,cudnn-buckets,graphs")
    args = p.parse_args()
    from engine.acoustic.streaming import AcousticGraphs, decode_streaming_batch

    root = Path(tempfile.mkdtemp(prefix="acoustic-shapes-"))
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    results = {}
    for precision in (args.precision, "fp32"):
        sovits = load(args.version, args.device, precision, root)
        with torch.inference_mode():
            for b in (int(x) for x in args.batches.split(",")):
                for name in args.modes.split(","):
                    graphs = AcousticGraphs(sovits) if name == "graphs" else None

                    def call_rows(call: int) -> list[dict]:
                        base = 40 + 13 * call if name != "cudnn-same" else 200
                        return rows_for(sovits, [base + 7 * i for i in range(b)] if name != "cudnn-same" else [200] * b,
                                        call)

                    if graphs is not None:  # the shapes met, then captured (serving: warm-up and between rounds)
                        for call in range(args.calls + 2):
                            decode_streaming_batch(sovits, call_rows(call), buckets=True, graphs=graphs)
                        graphs.capture_wanted()
                    times = []
                    for call in range(args.calls + 2):
                        rows = call_rows(call)
                        with backend(name):
                            ms = timed(lambda: decode_streaming_batch(sovits, rows, buckets=name in ("cudnn-buckets",
                                                                                                     "graphs"),
                                                                      graphs=graphs), sync)
                        if call >= 2:
                            times.append(ms)
                    if graphs is not None:
                        got = decode_streaming_batch(sovits, call_rows(3), buckets=True, graphs=graphs)
                        want = decode_streaming_batch(sovits, call_rows(3), buckets=True)  # the same rows and noise
                        diff = max(float((a.float() - c.float()).abs().max()) for x, y in zip(got, want)
                                   for a, c in zip(x, y))
                        print(f"{precision} batch {b:3d} graphs: {len(graphs.encoders)} + {len(graphs.voices)} "
                              f"graphs, {graphs.encoders.replays} + {graphs.voices.replays} replays; max |graphs - "
                              f"eager| (audio, latents) {diff:.3g}", flush=True)
                    results[(precision, b, name)] = statistics.median(times)
                    print(f"{precision} batch {b:3d} {name:10s} {statistics.median(times):8.2f} ms/call "
                          f"(min {min(times):.2f})", flush=True)
                rows = rows_for(sovits, [137 + 5 * i for i in range(b)], 99)
                outs = {}
                if "native" not in args.modes:
                    continue
                for name in ("cudnn", "native"):
                    for r in rows:
                        r["generator"].manual_seed(7)
                    with backend(name):
                        outs[name] = decode_streaming_batch(sovits, rows)
                diff = max(float((a[0].float() - c[0].float()).abs().max()) for a, c in zip(outs["cudnn"], outs["native"]))
                print(f"{precision} batch {b:3d} max |cudnn - native| audio difference {diff:.3g}", flush=True)
        sovits = None  # free it before the next precision's copy
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
