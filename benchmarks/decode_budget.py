"""Peak memory of N parallel reads of a maximal clip (8 channels, 384 kHz, 10 s FLAC), with the process's
decoding budget (engine.decode_budget) at a given size: how much the process grows, how many reads were
refused (503 on a server).

    python benchmarks/decode_budget.py                     # the default budget (256 MiB), 8 readers
    python benchmarks/decode_budget.py --budget-mb 100000  # as good as no budget (2f66d90's behaviour)

Each run measures in a fresh interpreter (the peak RSS of a process only grows).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

_WORKER = """
import io, json, resource, sys, threading
import numpy as np, soundfile as sf
from engine.decode_budget import DecodeBudgetError, process_decode_budget
from engine.reference import ReferenceRules, read_reference

readers, budget_mb = int(sys.argv[1]), float(sys.argv[2])
rate, seconds = 384000, 10.0
t = np.arange(int(rate * seconds)) / rate
tone = (0.03 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
buf = io.BytesIO()
sf.write(buf, np.repeat(tone[:, None], 8, axis=1), rate, format="FLAC", subtype="PCM_16")
clip = buf.getvalue()
del t, tone, buf
process_decode_budget().resize(int(budget_mb * (1 << 20)))
rules = ReferenceRules(fit="trim_pad")
read_reference(io.BytesIO(clip), rules)  # the libraries' first-use memory is not a read's
def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
base, outcomes, gate = peak_mb(), [], threading.Barrier(readers)
def read():
    gate.wait()
    try:
        read_reference(io.BytesIO(clip), rules)
        outcomes.append("read")
    except DecodeBudgetError:
        outcomes.append("refused")
threads = [threading.Thread(target=read) for _ in range(readers)]
for th in threads: th.start()
for th in threads: th.join()
print(json.dumps({"readers": readers, "budget_mb": budget_mb, "clip_mb": len(clip) / 2**20,
                  "growth_mb": round(peak_mb() - base), "read": outcomes.count("read"),
                  "refused": outcomes.count("refused")}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--readers", type=int, default=8)
    parser.add_argument("--budget-mb", type=float, default=256)
    args = parser.parse_args()
    done = subprocess.run([sys.executable, "-c", _WORKER, str(args.readers), str(args.budget_mb)],
                          capture_output=True, text=True, check=True)
    print(json.dumps(json.loads(done.stdout.strip().splitlines()[-1])))


if __name__ == "__main__":
    main()
