"""The scheduler's own host work per decode step, with the device work taken out: the slot decoder's step is
replaced by one that returns random tokens at once, so what is timed is the decode loop around it (the gate,
the stop rules, the chunk tracker, the bookkeeping of rows). Tiny random v2 weights on the CPU; whole-file
requests in closed loop, every sentence to ``--tokens``.

    python benchmarks/scheduler_host_step.py [--clients 1,8,64] [--tokens 400]

Prints, per client count, the decode steps run and the microseconds per step spent in the timed section of
the loop (``Scheduler.t2s_seconds``: the step and its bookkeeping, under the device gate).
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", default="1,8,64")
    ap.add_argument("--tokens", type=int, default=400)
    args = ap.parse_args()

    import tests.support.synth as sup
    from engine.options import EngineSettings, SynthesisOptions
    from engine.reference import Reference
    from engine.studio import Studio
    from engine.serving.slots import SlotDecoder

    shared = sup.studio("v2")
    studio = Studio(shared.default_weights, shared.runtime, EngineSettings(scheduler_slots=64), pool=shared.pool)
    ref = Reference(sup.wav_bytes(sup.clip()), sup.REF_TEXT, "en")
    opts = SynthesisOptions(streaming_mode=False, seed=1, early_stop_num=args.tokens, text_split_method="cut0")
    rng = np.random.default_rng(0)

    def instant_step(self, n: int):  # what SlotDecoder.step returns, without the device work
        self.pos_host = (self.pos_host + 1) % self.capacity
        tokens = rng.integers(0, 1000, n)
        return tokens, tokens

    real_step = SlotDecoder.step
    try:
        list(studio.synthesize("Hello there.", "en", ref, opts))  # models, reference and scheduler made
        sched = studio.scheduler(studio.cloner().models)
        SlotDecoder.step = instant_step
        for clients in (int(c) for c in args.clients.split(",")):
            steps, busy = sched.steps, sched.t2s_seconds
            threads = [threading.Thread(target=lambda: list(studio.synthesize("Hello there.", "en", ref, opts)))
                       for _ in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            n = sched.steps - steps
            print(f"{clients:4d} clients: {n} decode steps, {1e6 * (sched.t2s_seconds - busy) / n:.1f} us of host "
                  "work per step", flush=True)
    finally:
        SlotDecoder.step = real_step
        studio.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
