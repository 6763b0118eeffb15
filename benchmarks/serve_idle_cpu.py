"""What an idle ``sovits-studio serve`` costs the CPU: after its warm-up, and after a request.

    python benchmarks/serve_idle_cpu.py --config /tmp/v2full/tts_infer.yaml [--idle 20] [--omp-wait default]

Starts ``serve`` on the CPU (float32) in a child process, waits for ``/health`` to say ready, and samples the
server's CPU seconds (every thread, ``/proc/PID/task``) over ``--idle`` seconds; then sends one request
(``sovits-studio loadtest --requests 1``: a synthetic reference, one streamed sentence) and samples again,
from the moment the request's answer has ended. An idle server should use next to nothing: OpenMP workers that
spun (or a team that stayed busy-waiting) would show as seconds of CPU here. Per window: CPU seconds, the share
of one core, the server's OS threads, and the busiest threads.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of every live thread of ``pid``, keyed 'comm/tid'."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            out[f"{comm}/{task.name}"] = (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            continue
    return out


def window(pid: int, seconds: float) -> dict:
    before = thread_cpu(pid)
    time.sleep(seconds)
    after = thread_cpu(pid)
    delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
    gone = sum(v for k, v in before.items() if k not in after)  # threads that ended meanwhile: not counted
    busiest = sorted(((round(v, 3), k) for k, v in delta.items() if v > 0), reverse=True)[:4]
    cpu = sum(delta.values())
    return {"seconds": seconds, "cpu_s": round(cpu, 3), "core_share": round(cpu / seconds, 4),
            "threads": len(after), "threads_ended": len([k for k in before if k not in after]),
            "busiest": busiest, "cpu_of_ended_threads_before": round(gone, 3),
            "load": round(os.getloadavg()[0], 2)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, server: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited ({server.returncode}) before it was ready")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                if json.loads(r.read()).get("status") == "ready":
                    return
        except (OSError, ValueError):
            pass
        time.sleep(1.0)
    raise SystemExit(f"the server was not ready within {timeout:g} s")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="tts_infer.yaml (make-test-weights writes one)")
    p.add_argument("--idle", type=float, default=20.0, help="seconds per idle window")
    p.add_argument("--omp-wait", choices=("default", "passive"), default="default",
                   help="the server's OpenMP waits: libgomp's default (what serve leaves alone) or PASSIVE")
    p.add_argument("--ready-timeout", type=float, default=300.0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if args.omp_wait == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH")) if x)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(Path(tempfile.mkdtemp(prefix="serve-idle-")) / "server.log", "wb")  # noqa: SIM115
    server = subprocess.Popen([sys.executable, "-m", "studio.cli", "serve", "--config", args.config, "--device", "cpu",
                               "--precision", "fp32", "--port", str(port), "--shutdown-grace", "2"],
                              cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    report: dict = {"omp_wait": args.omp_wait, "nproc": os.cpu_count(), "server_log": log.name}
    try:
        t0 = time.monotonic()
        wait_ready(url, server, args.ready_timeout)
        report["ready_after_s"] = round(time.monotonic() - t0, 1)
        report["idle_after_warm_up"] = window(server.pid, args.idle)
        print(json.dumps({"idle_after_warm_up": report["idle_after_warm_up"]}), flush=True)
        t0 = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "studio.cli", "loadtest", "--url", url, "--clients", "1",
                               "--requests", "1", "--text-lang", "zh", "--text", "人工智能正在改变我们的生活。",
                               "--json"], cwd=ROOT, env=env, capture_output=True, text=True)
        report["request_s"] = round(time.monotonic() - t0, 2)
        report["request_ok"] = done.returncode == 0
        report["after_request_first_second"] = window(server.pid, 1.0)
        report["idle_after_request"] = window(server.pid, args.idle)
        print(json.dumps({k: report[k] for k in ("request_s", "request_ok", "after_request_first_second",
                                                 "idle_after_request")}), flush=True)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
