"""What the GIL's switch interval costs a thread that waits on the device between short Python sections.

Under load on an H100 a decode step took 3.7-4.0 ms for ~36 rows, against 0.9 ms for one row alone
(docs/benchmarks.md, issue 31), while the step's own host work is ~0.1 ms (benchmarks/scheduler_host_step.py).
A decode step releases the GIL while it waits for the device, then needs it back; when another thread is running
Python meanwhile (the HTTP server, reference threads, the acoustic thread), CPython gives the GIL back only when
that thread blocks or when the waiter has waited ``sys.getswitchinterval()`` (5 ms by default). This measures that
mechanism alone, on the CPU: a "decode" thread whose steps wait ``--device-ms`` with the GIL released (as a device
wait does), then run ``--python-us`` of Python; beside it ``busy`` threads that run Python without blocking. It
prints the mean step time and the busy threads' work per second for each switch interval.

    python benchmarks/gil_handoff.py [--intervals 5,1,0.5,0.2] [--busy 0,1,4] [--steps 300]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time


def python_work(us: float) -> None:
    """About ``us`` microseconds of Python (the GIL held throughout)."""
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


def run(interval_ms: float, busy: int, steps: int, device_ms: float, python_us: float) -> tuple[float, float]:
    sys.setswitchinterval(interval_ms / 1000)
    stop = threading.Event()
    done = [0] * busy

    def spin(i: int) -> None:
        while not stop.is_set():
            python_work(50)
            done[i] += 1

    threads = [threading.Thread(target=spin, args=(i,), daemon=True) for i in range(busy)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    t0 = time.perf_counter()
    for _ in range(steps):
        time.sleep(device_ms / 1000)  # the GIL released while the device works
        python_work(python_us)  # the step's bookkeeping
    wall = time.perf_counter() - t0
    stop.set()
    for t in threads:
        t.join()
    return 1e3 * wall / steps, sum(done) / wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--intervals", default="5,1,0.5,0.2", help="switch intervals in ms (5: CPython's default)")
    ap.add_argument("--busy", default="0,1,4", help="threads running Python beside the decode thread")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--device-ms", type=float, default=0.9, help="the step's wait for the device")
    ap.add_argument("--python-us", type=float, default=100, help="the step's Python bookkeeping")
    args = ap.parse_args()
    default = sys.getswitchinterval()
    print(f"step: {args.device_ms} ms waiting with the GIL released, then {args.python_us} us of Python; "
          f"alone it would take {args.device_ms + args.python_us / 1e3:.2f} ms", flush=True)
    print("| switch interval (ms) | busy threads | ms per step | busy threads' work (units/s) |")
    print("|---|---|---|---|")
    try:
        for busy in (int(b) for b in args.busy.split(",")):
            for interval in (float(i) for i in args.intervals.split(",")):
                ms, work = run(interval, busy, args.steps, args.device_ms, args.python_us)
                print(f"| {interval:g} | {busy} | {ms:.2f} | {work:,.0f} |", flush=True)
    finally:
        sys.setswitchinterval(default)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
