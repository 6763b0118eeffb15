"""The same request through the serving scheduler and on the caller's thread, interleaved, on the CPU.

    python benchmarks/serving_vs_caller.py --config /tmp/v2full/tts_infer.yaml --tokens 150 --repeats 5

Two ``Studio`` objects on the same weights: ``EngineSettings(scheduler=True)`` (what ``serve`` and the web
page use) and ``scheduler=False`` (the official flow on the caller's thread). After a warm-up request each,
the same whole-file request (same text, seed, clip; ``early_stop_num`` = ``--tokens``) runs through both
alternately, ``--repeats`` times, so that outside load on a shared machine hits both alike. Per run it records
the wall time, the process's CPU time and every thread's CPU time (``/proc/self/task``: which threads worked),
the number of OS threads, and the machine's load average; at the end the medians (wall, CPU, T2S seconds with
the prefill and its tokens/s, RTF), the ratio, and what each of the scheduler's threads sees of torch's thread
pools (``torch.get_num_threads()`` asked on that thread).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from busy_neighbours import busy_neighbours  # benchmarks/ (the script's folder)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# one sentence (cut0 keeps it whole), or the same words as four sentences (cut5 cuts at every comma)
TEXT = ("人工智能正在改变我们的生活，从语音助手到自动驾驶，新的技术每天都在出现，语音合成让机器能够用人的声音说话，"
        "它可以朗读新闻讲故事")
SPLITS = {"one": "cut0", "multi": "cut5"}


def _ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


def thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of every live thread of this process, keyed 'name/tid'."""
    out = {}
    names = {t.native_id: t.name for t in threading.enumerate()}
    base = Path("/proc/self/task")
    if not base.exists():
        return out
    for task in base.iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            name = names.get(int(task.name), "omp-worker" if comm == "python" else comm)
            out[f"{name}/{task.name}"] = (int(fields[11]) + int(fields[12])) / _ticks()
        except OSError:
            continue
    return out


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


STAGE_SECONDS: dict[str, float] = {}


def timed_stages() -> None:
    """Time the cloner's stages (front end, T2S, acoustic) wherever they run: wrappers around VoiceCloner's
    methods that add each call's wall time to STAGE_SECONDS (the scheduler's own counters split its T2S)."""
    from engine import VoiceCloner

    def wrap(name, key):
        fn = getattr(VoiceCloner, name)

        def timed(self, *a, **k):
            t0 = time.perf_counter()
            try:
                return fn(self, *a, **k)
            finally:
                STAGE_SECONDS[key] = STAGE_SECONDS.get(key, 0.0) + time.perf_counter() - t0
        setattr(VoiceCloner, name, timed)

    for name, key in (("_features", "front_end_s"), ("_decode_batch", "t2s_s"), ("_acoustic", "acoustic_s")):
        wrap(name, key)


def one_run(studio, reference, tokens: int, seed: int, split: str = "cut0") -> dict:
    from engine.options import SynthesisOptions

    opts = SynthesisOptions(seed=seed, early_stop_num=tokens, text_split_method=split)
    sched = next(iter(studio._schedulers.values()), None)
    counters = ("steps", "t2s_seconds", "prefill_seconds", "acoustic_seconds")
    before_sched = {k: getattr(sched, k) for k in counters} if sched else {}
    before_stages = dict(STAGE_SECONDS)
    before_threads = thread_cpu()
    load = load_average()
    c0, t0 = time.process_time(), time.perf_counter()
    results = list(studio.synthesize(TEXT, "zh", reference, opts))
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    after = thread_cpu()
    per_thread = {k: round(v - before_threads.get(k, 0.0), 3) for k, v in after.items()
                  if v - before_threads.get(k, 0.0) >= 0.02}
    stages = {k: round(v - before_stages.get(k, 0.0), 3) for k, v in STAGE_SECONDS.items()}
    if sched:
        stages.update({k: round(getattr(sched, k) - before_sched[k], 3) for k in counters})
    audio = sum(len(r.audio) for r in results) / results[0].sample_rate
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "audio_s": round(audio, 3),
            "threads": len(after), "load": load, "per_thread_cpu_s": per_thread,
            "tokens": sum(len(r.tokens) for r in results), "stages": stages}


def t2s_seconds(stages: dict) -> float:
    """A run's T2S time, prefill included: the scheduler's counters, or the caller flow's decode calls."""
    if stages.get("steps"):
        return round(stages["t2s_seconds"] + stages["prefill_seconds"], 3)
    return stages["t2s_s"]


def pool_view(studio) -> dict:
    """torch.get_num_threads() / get_num_interop_threads() asked on each of the scheduler's threads."""
    import torch

    seen = {"caller": (torch.get_num_threads(), torch.get_num_interop_threads())}
    sched = next(iter(studio._schedulers.values()), None)
    if sched is None:
        return seen
    seen["text"] = sched.text_executor.submit(lambda: (torch.get_num_threads(),
                                                       torch.get_num_interop_threads())).result()
    return {k: {"intra_op": v[0], "inter_op": v[1]} for k, v in seen.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None, help="tts_infer.yaml (default: random full-size v2 weights)")
    p.add_argument("--tokens", type=int, default=150)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--sentences", choices=sorted(SPLITS), default="one",
                   help="one: the text as one sentence; multi: cut at every comma (four sentences, each to --tokens)")
    p.add_argument("--omp-wait", choices=("default", "passive"), default="default",
                   help="default: libgomp's own spin-then-sleep (what the sovits-studio commands leave); passive: "
                        "OMP_WAIT_POLICY=PASSIVE (engine.platform_env.passive_cpu_threads), chosen before torch loads")
    p.add_argument("--busy", type=int, default=0,
                   help="other processes spinning on the CPU meanwhile (pure Python loops): cores not the engine's")
    p.add_argument("--json", default=None)
    args = p.parse_args()

    from engine.platform_env import openmp_waits, passive_cpu_threads

    if args.omp_wait == "passive":
        passive_cpu_threads()
    import torch

    from studio.bench import REF_TEXT, synthetic_reference
    from engine.options import EngineSettings
    from engine import Reference, Studio

    work = Path(tempfile.mkdtemp(prefix="serving-vs-caller-"))
    config = args.config
    if config is None:
        from engine.testweights import make_test_weights

        config = str(make_test_weights(work, "v2", full_size=True))
    reference = Reference(str(synthetic_reference(work / "ref.wav")), REF_TEXT, "zh")
    timed_stages()
    flows = {}
    for name, sched in (("scheduler", True), ("caller", False)):
        studio = Studio.from_config(config, device="cpu", precision="fp32",
                                    settings=EngineSettings(scheduler=sched))
        first = one_run(studio, reference, args.tokens, args.seed, SPLITS[args.sentences])  # warm-up: reference prepared, kernels chosen
        print(json.dumps({"flow": name, "warm_up": first}), flush=True)
        flows[name] = studio
    runs: dict[str, list[dict]] = {k: [] for k in flows}
    with busy_neighbours(args.busy):
        for i in range(args.repeats):
            order = list(flows) if i % 2 == 0 else list(reversed(flows))
            for name in order:
                r = one_run(flows[name], reference, args.tokens, args.seed, SPLITS[args.sentences])
                runs[name].append(r)
                print(json.dumps({"flow": name, "run": i, **r}), flush=True)
    summary = {"nproc": os.cpu_count(), "torch_threads": torch.get_num_threads(), "openmp": openmp_waits(),
               "busy_processes": args.busy, "pools": pool_view(flows["scheduler"])}
    for name, rs in runs.items():
        summary[name] = {"wall_s": statistics.median(r["wall_s"] for r in rs),
                         "cpu_s": statistics.median(r["cpu_s"] for r in rs),
                         "audio_s": rs[-1]["audio_s"], "tokens": rs[-1]["tokens"],
                         "loads": [r["load"][0] for r in rs]}
        summary[name]["rtf"] = round(summary[name]["wall_s"] / summary[name]["audio_s"], 3)
        summary[name]["t2s_s"] = statistics.median(t2s_seconds(r["stages"]) for r in rs)
        summary[name]["t2s_tokens_per_s"] = round(rs[-1]["tokens"] / summary[name]["t2s_s"], 1)
    summary["ratio_scheduler_over_caller"] = round(summary["scheduler"]["wall_s"] / summary["caller"]["wall_s"], 3)
    print(json.dumps({"summary": summary}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "runs": runs}, indent=1), encoding="utf-8")
    for s in flows.values():
        s.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
