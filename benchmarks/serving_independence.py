"""Is a request's output the same alone and beside others? Runs a few requests one at a time, then the
same requests among many others, and compares tokens and audio (per precision). Prints JSON.

    python benchmarks/serving_independence.py --version v2ProPlus --full-size --device cuda --precisions fp32,fp16
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from serving_streams import BenchCloner, load, reference

from engine.options import SynthesisOptions, resolve_plan
from engine.serving.scheduler import Scheduler, SchedulerConfig


def run(cloner, ref, seed: int, stream: bool):
    opts = SynthesisOptions(streaming_mode=stream, seed=seed, top_k=15, temperature=0.9, top_p=0.95)
    plan = resolve_plan(opts, cloner.models.version)
    results = list(cloner._serve(["a", "b"], "zh", ref, opts, plan, seed, None))
    return [r.tokens for r in results], np.concatenate([r.audio for r in results])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--version", default="v2ProPlus")
    ap.add_argument("--full-size", action="store_true")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--precisions", default="fp32")
    ap.add_argument("--tokens", type=int, default=120)
    ap.add_argument("--others", type=int, default=24)
    ap.add_argument("--weights", default="")
    args = ap.parse_args()
    root = Path(args.weights or tempfile.mkdtemp(prefix="serving-indep-"))
    root.mkdir(parents=True, exist_ok=True)
    report = {}
    for precision in args.precisions.split(","):
        models = load(args.version, args.full_size, args.device, precision, root)
        sched = Scheduler(models, SchedulerConfig(slots=args.others + 8, queue=64, context=1024))
        cloner = BenchCloner(models, sched, 40, args.tokens)
        ref = reference(models)
        out = {}
        for stream in (True, False):
            seeds = [11, 12, 13, 14]
            alone = [run(cloner, ref, s, stream) for s in seeds]
            together: list = [None] * len(seeds)

            def work(i, out=together, seeds=seeds, stream=stream, cloner=cloner, ref=ref):
                out[i] = run(cloner, ref, seeds[i], stream)

            threads = [threading.Thread(target=work, args=(i,)) for i in range(len(seeds))]
            threads += [threading.Thread(target=run, args=(cloner, ref, 500 + j, stream)) for j in range(args.others)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            out["stream" if stream else "whole"] = [
                {"tokens_equal": a[0] == b[0], "audio_equal": a[1].shape == b[1].shape and bool(np.array_equal(a[1], b[1])),
                 "audio_max_diff": float(np.abs(a[1] - b[1]).max()) if a[1].shape == b[1].shape else None}
                for a, b in zip(alone, together)]
        sched.close()
        report[precision] = out
        print(precision, json.dumps(out), flush=True)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
