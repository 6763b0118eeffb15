"""Why the serving scheduler and the caller's thread ran T2S at different speeds on the CPU: libgomp's spin.

    python benchmarks/omp_wait_policy.py [--tokens 40] [--pairs 3] [--policies default,PASSIVE] [--busy N]

PyTorch's CPU kernels run in OpenMP parallel regions. After a region, libgomp's worker threads spin (busy-wait)
for the next one: 300,000 spins by default (a few milliseconds), but only 100 once the process holds more
OpenMP threads than CPUs. Every Python thread that runs torch work gets a team of its own, so the serving
scheduler (decode loop, acoustic worker, front-end thread, caller) crosses that line on a 2-core machine and
the caller's thread alone does not: the two flows wait differently for the same work. Spinning is fast on an
idle machine and ruinous on a loaded one (a spinning worker holds a core another process needs, and stalls
when its master is descheduled).

Each policy (the ``OMP_WAIT_POLICY`` value, ``default`` = unset) runs in a child process of its own, the
children alternating ``--pairs`` times so that outside load hits every policy alike. A child decodes
``--tokens`` greedy tokens with the full-size random v2 T2S (reference loop, fp32, batch 1) on its main thread,
first alone, then beside two idle OpenMP teams (two threads that ran one parallel region each and now wait,
as the scheduler's threads did between requests), then beside two threads that ran a region and gave their
team back before waiting (``engine.openmp.release_team``, what the scheduler's threads do now). Per case: wall
and CPU milliseconds per token, voluntary context switches per token (a worker that went to sleep between
regions), and the load average. ``--busy N`` keeps N other processes spinning on the CPU meanwhile (pure
Python loops): what the policies do when the cores are not the engine's alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from busy_neighbours import busy_neighbours  # benchmarks/ (the script's folder)

ROOT = Path(__file__).resolve().parents[1]


def _switches() -> tuple[int, int]:
    vol = inv = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            for line in open(f"/proc/self/task/{tid}/status"):
                if line.startswith("voluntary_ctxt_switches"):
                    vol += int(line.split(":")[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    inv += int(line.split(":")[1])
        except OSError:
            continue
    return vol, inv


def child(tokens: int) -> dict:
    sys.path.insert(0, str(ROOT))
    import torch

    from engine.models.t2s import T2SDims
    from engine.openmp import release_team
    from engine.t2s.decoding import SamplingParams, StopRules, T2SDecoder, T2SInput
    from engine.testweights.t2s import random_t2s_model

    g = torch.Generator().manual_seed(0)
    item = T2SInput(torch.randint(1, 732, (40,), generator=g), torch.randn(1024, 40, generator=g))
    prompt = torch.randint(0, 1024, (100,), generator=g)
    rules = StopRules(early_stop_num=tokens - 1, min_steps=10**9)
    greedy = SamplingParams(top_k=1, repetition_penalty=1.35)
    decoder = T2SDecoder(random_t2s_model(T2SDims(), seed=0))

    def run() -> dict:
        v0, i0 = _switches()
        t0, c0 = time.perf_counter(), time.process_time()
        decoder.decode_naive(item, prompt, greedy, rules)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        v1, i1 = _switches()
        return {"wall_ms_per_token": round(1000 * wall / tokens, 2), "cpu_ms_per_token": round(1000 * cpu / tokens, 2),
                "voluntary_switches_per_token": round((v1 - v0) / tokens, 1),
                "involuntary_switches_per_token": round((i1 - i0) / tokens, 1)}

    run()  # warm-up
    out = {"alone": run(), "load_before": round(os.getloadavg()[0], 2)}
    release = threading.Event()

    def idle_team() -> None:
        torch.ones(1 << 22).mul_(2).sum()  # one parallel region on this thread: an OpenMP team of its own
        release.wait()

    def released_team() -> None:
        torch.ones(1 << 22).mul_(2).sum()
        release_team()  # what the scheduler's threads do before they wait
        release.wait()

    for case, target in (("beside_two_idle_teams", idle_team), ("beside_two_released_teams", released_team)):
        release.clear()
        threads = [threading.Thread(target=target) for _ in range(2)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        out[case] = run()
        release.set()
        for t in threads:
            t.join()
    out["os_threads"] = len(os.listdir("/proc/self/task"))
    out["load_after"] = round(os.getloadavg()[0], 2)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=40)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--policies", default="default,PASSIVE", help="OMP_WAIT_POLICY values; default = unset")
    p.add_argument("--busy", type=int, default=0, help="other processes spinning on the CPU meanwhile")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.tokens)))
        return 0
    policies = args.policies.split(",")
    runs: dict[str, list[dict]] = {k: [] for k in policies}
    with busy_neighbours(args.busy):
        for i in range(args.pairs):
            for policy in policies if i % 2 == 0 else list(reversed(policies)):
                env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
                if policy != "default":
                    env["OMP_WAIT_POLICY"] = policy
                out = subprocess.run([sys.executable, __file__, "--child", "--tokens", str(args.tokens)], env=env,
                                     capture_output=True, text=True, check=True)
                r = json.loads(out.stdout.strip().splitlines()[-1])
                runs[policy].append(r)
                print(json.dumps({"policy": policy, "pair": i, **r}), flush=True)
    summary = {"nproc": os.cpu_count(), "tokens": args.tokens, "busy_processes": args.busy}
    for policy, rs in runs.items():
        summary[policy] = {case: {k: statistics.median(r[case][k] for r in rs) for k in rs[0][case]}
                           for case in ("alone", "beside_two_idle_teams", "beside_two_released_teams")}
        summary[policy]["loads"] = [r["load_before"] for r in rs]
    print(json.dumps({"summary": summary}, indent=1), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "runs": runs}, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
