"""The product path under load, in one command: ``sovits-studio serve`` on random official-format
weights, ``loadtest --mix`` (a clip of its own per client, Mandarin / English / Japanese through the
real text front end, streams and whole files) at 1 / 16 / 64 / 256 / 1,000 clients, a check that the
server still serves afterwards, and, in the same run, gsv-tts-lite's streaming and batch APIs on the
same weights, texts and clips when that package is importable (``benchmarks/gsv_lite_load.py``).

Writes ``product_load.json`` (every figure), ``product_load.md`` (the tables for docs/benchmarks.md),
``server.log`` and ``gsv_lite.log`` to ``--out``; the report is rewritten after every level, so a run
cut short keeps what it measured.

    # the GPU run (docs/benchmarks.md has the device command that carries the wheels and clips)
    python3 benchmarks/product_load.py --out $OUT
    # the same on a CPU, small: tiny weights, short levels
    python3 benchmarks/product_load.py --tiny --device cpu --precision fp32 --levels 1,4 --duration 3 \\
        --max-tokens 20 --out test-output/product_load
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from studio.loadtest import LoadConfig, LoadTestError, run_load  # noqa: E402
from studio.loadtest.mix import MODES, TEXTS, load_mix  # noqa: E402
from studio.loadtest.report import (BREAKDOWN_COLUMNS, MIX_COLUMNS, breakdown_rows, mix_rows,  # noqa: E402
                                    render_table)
from studio.loadtest.run import raise_open_files_limit  # noqa: E402

REF_DIRS = (".gpu/refset", "../shared/refset")  # the carried copy on the GPU machine, the shared one here
MAX_RECORDS = 20000  # per-request records kept per level in the JSON (it must come back: 16 MB a file)


def _ints(value: str) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        out = ()
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: give counts >= 1, comma-separated (e.g. 1,16,64)")
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", default="test-output/product_load", help="folder for the report, tables and logs")
    ap.add_argument("--levels", type=_ints, default=(1, 16, 64, 256, 1000), help="concurrent clients per level")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds per level in which requests start")
    ap.add_argument("--timeout", type=float, default=120.0, help="longest one request may take (then: timeout)")
    ap.add_argument("--version", default="v2ProPlus", help="model version of the random weights")
    ap.add_argument("--tiny", action="store_true", help="tiny random weights instead of the official sizes")
    ap.add_argument("--weights", default=None, metavar="DIR_OR_YAML",
                    help="use this model set (a make-test-weights folder or its tts_infer.yaml) instead of "
                         "writing random weights")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--max-tokens", type=int, default=200,
                    help="serve --max-tokens-per-sentence: random weights never stop, so every sentence "
                         "runs to this cap (25 tokens = 1 s of audio)")
    ap.add_argument("--ref-dir", default=None,
                    help=f"reference clips with a manifest.json (default: the first of {', '.join(REF_DIRS)})")
    ap.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                    help="another flag for sovits-studio serve (repeatable), e.g. --serve-arg=--slots=128")
    ap.add_argument("--warmup", type=int, default=len(TEXTS) * len(MODES),
                    help="requests sent one by one before the levels (default: each mode and language once)")
    ap.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for /health ready")
    ap.add_argument("--gsv", choices=("auto", "off", "only"), default="auto",
                    help="gsv-tts-lite on the same weights: auto (when importable), off, or only (no server)")
    ap.add_argument("--gsv-levels", type=_ints, default=None, help="client counts for gsv-tts-lite (default --levels)")
    ap.add_argument("--omp-wait", choices=("default", "passive"), default="default",
                    help="the server's OpenMP waits: libgomp's default spin-then-sleep (what serve leaves alone), "
                         "or OMP_WAIT_POLICY=PASSIVE")
    ap.add_argument("--budget", type=float, default=570.0,
                    help="seconds this command may take in all: a level or phase that would not end in time "
                         "is skipped and the report says so (the device tool stops a command at 600 s)")
    return ap.parse_args(argv)


class Run:
    """The run's output folder, clock and report, written out after every step."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.monotonic()
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.temp_weights: Path | None = None  # random weights written by this run (removed at its end)
        self.report: dict[str, Any] = {"benchmark": "benchmarks/product_load.py", "started": _utc(),
                                       "settings": {k: v for k, v in vars(args).items()},
                                       "machine": machine(), "notes": []}

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.args.budget - self.elapsed()

    def log(self, message: str) -> None:
        print(f"[{self.elapsed():6.1f} s] {message}", flush=True)

    def note(self, message: str) -> None:
        self.log(message)
        self.report["notes"].append(message)
        self.save()

    def save(self) -> None:
        (self.out / "product_load.json").write_text(json.dumps(self.report, indent=1, ensure_ascii=False),
                                                    encoding="utf-8")
        (self.out / "product_load.md").write_text(markdown(self.report), encoding="utf-8")


def _utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def machine() -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version(), "cpus": os.cpu_count(), "host": platform.node()}
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if gpu.returncode == 0:
            out["gpus"] = [line.strip() for line in gpu.stdout.splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        from importlib.metadata import version

        out["torch"] = version("torch")
        out["transformers"] = version("transformers")
    except Exception:  # noqa: BLE001 - a report field, never a failure
        pass
    return out


def load_average() -> float | None:
    """The machine's 1-minute load average (runnable threads; above the CPU count, work waits for a core)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def server_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) the server process has used so far (0 where /proc is missing)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 10.0) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.loads(r.read().decode("utf-8"))
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read().decode("utf-8"))
        except ValueError:
            return e.code, {}


def weights_config(run: Run) -> Path:
    """The model set's tts_infer.yaml: the given one, or random weights written now."""
    args = run.args
    if args.weights:
        given = Path(args.weights)
        config = given if given.is_file() else given / "tts_infer.yaml"
        if not config.is_file():
            raise SystemExit(f"--weights: {config} does not exist (give a make-test-weights folder or its yaml)")
        return config
    from engine.testweights import make_test_weights

    run.temp_weights = Path(tempfile.mkdtemp(prefix="product-load-"))
    folder = run.temp_weights / args.version
    t = time.monotonic()
    config = make_test_weights(folder, args.version, full_size=not args.tiny)
    run.log(f"wrote random {'tiny' if args.tiny else 'full-size'} {args.version} weights to {folder} "
            f"in {time.monotonic() - t:.1f} s")
    return config


def omp_waits(env: dict[str, str], policy: str) -> None:
    """The OpenMP waits of a child process: libgomp's default (the user's own settings dropped) or passive."""
    env.pop("OMP_WAIT_POLICY", None)
    env.pop("GOMP_SPINCOUNT", None)
    if policy == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"


def start_server(run: Run, config: Path, port: int) -> subprocess.Popen:
    args = run.args
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
           "PYTHONUNBUFFERED": "1"}
    omp_waits(env, args.omp_wait)
    cmd = [sys.executable, "-m", "studio.cli", "serve", "--config", str(config), "--device", args.device,
           "--precision", args.precision, "--port", str(port), "--max-tokens-per-sentence", str(args.max_tokens),
           "--shutdown-grace", "5", "--profiles-dir", str(Path(tempfile.mkdtemp(prefix="voices-"))),
           *args.serve_arg]
    run.report["server_command"] = " ".join(cmd[1:])
    run.log("starting: " + " ".join(cmd[1:]))
    log = open(run.out / "server.log", "wb")  # noqa: SIM115 - the child writes it until it ends
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def wait_ready(run: Run, server: subprocess.Popen, url: str) -> dict[str, Any]:
    deadline = time.monotonic() + min(run.args.ready_timeout, max(run.left(), 1.0))
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited ({server.returncode}) before it was ready; "
                               f"see server.log:\n{_tail(run.out / 'server.log')}")
        try:
            status, last = get_json(f"{url}/health", 5.0)
            if status == 200 and last.get("status") == "ready":
                return last
        except (OSError, ValueError):
            pass
        time.sleep(1.0)
    raise RuntimeError(f"the server was not ready within {run.args.ready_timeout:g} s (last /health: {last}); "
                       f"see server.log:\n{_tail(run.out / 'server.log')}")


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def stop_server(run: Run, server: subprocess.Popen) -> None:
    if server.poll() is None:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
    run.log(f"server stopped ({server.returncode})")
    trim_log(run.out / "server.log")


def trim_log(path: Path, keep_head: int = 1 << 20, keep_tail: int = 6 << 20) -> None:
    """Keep a log small enough to come back from the device machine (16 MB a file): its head and tail."""
    size = path.stat().st_size if path.exists() else 0
    if size <= keep_head + keep_tail:
        return
    with open(path, "rb") as f:
        head = f.read(keep_head)
        f.seek(size - keep_tail)
        tail = f.read()
    path.write_bytes(head + f"\n[... {size - keep_head - keep_tail} bytes cut ...]\n".encode() + tail)


def server_phase(run: Run, mix) -> None:
    args = run.args
    config = weights_config(run)
    run.report["weights"] = str(config)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(run, config, port)
    try:
        t = time.monotonic()
        health = wait_ready(run, server, url)
        run.report["server_ready_s"] = round(time.monotonic() - t, 1)
        run.log(f"server ready in {run.report['server_ready_s']} s: {health}")
        # a level may take its duration plus the last requests' time (at most the request timeout)
        level_cost = args.duration + args.timeout
        mark = {"cpu": server_cpu_s(server.pid), "load": load_average()}

        def on_level(level: dict[str, Any]) -> bool:
            # what the machine was doing meanwhile: a shared machine's load changes every figure above
            cpu, load = server_cpu_s(server.pid), load_average()
            level["machine_load"] = [mark["load"], load]
            level["server_cpu_s"] = round(cpu - mark["cpu"], 2)
            if level.get("audio_s"):
                level["server_cpu_per_audio_s"] = round(level["server_cpu_s"] / level["audio_s"], 3)
            mark.update(cpu=cpu, load=load)
            if len(level["streams"]) > MAX_RECORDS:  # the figures are over all; the JSON keeps a sample
                run.note(f"{level['clients']} clients: the report keeps the first {MAX_RECORDS} of "
                         f"{len(level['streams'])} per-request records")
                level["streams"] = level["streams"][:MAX_RECORDS]
            run.report.setdefault("levels", []).append(level)
            run.save()
            if run.left() < level_cost + 60:  # 60 s: the check after the levels and the shutdown
                nxt = [c for c in args.levels if c > level["clients"]]
                if nxt:
                    run.note(f"levels {', '.join(map(str, nxt))} skipped: {run.left():.0f} s of the "
                             f"{args.budget:g} s budget left, a level may take {level_cost:g} s")
                return False
            return True

        cfg = LoadConfig(url=url, clients=args.levels, duration_s=args.duration, timeout_s=args.timeout,
                         warmup=args.warmup, mix=mix)
        report = run_load(cfg, log=run.log, on_level=on_level)
        run.report["loadtest"] = {k: v for k, v in report.items() if k != "levels"}
        run.save()
        after_check(run, url, mix, server)
    finally:
        stop_server(run, server)
        run.save()


def after_check(run: Run, url: str, mix, server: subprocess.Popen) -> None:
    """One request of each mode and language, one at a time, and /health: does the server still serve?"""
    n = len(mix.texts) * len(mix.modes)
    cfg = LoadConfig(url=url, clients=(1,), requests=n, duration_s=None, timeout_s=run.args.timeout, warmup=0,
                     mix=mix)
    try:
        level = run_load(cfg)["levels"][0]
        requests = {"sent": level["requests"], "ok": level["completed"], "errors": level["errors"],
                    "error_messages": level["error_messages"]}
    except LoadTestError as e:
        requests = {"sent": n, "ok": 0, "errors": {"unreachable": n}, "error_messages": {"unreachable": str(e)}}
    try:
        status, health = get_json(f"{url}/health")
    except OSError as e:
        status, health = None, {"error": str(e)}
    ok = requests["ok"] == n and status == 200 and health.get("status") == "ready" and server.poll() is None
    run.report["after"] = {"requests": requests, "health_status": status, "health": health, "still_serves": ok}
    run.log(f"after the levels: {requests['ok']}/{n} requests ok, /health {status} {health} -> "
            f"{'still serves' if ok else 'DOES NOT SERVE'}")
    run.save()


def gsv_phase(run: Run, mix_dir: Path) -> None:
    """gsv-tts-lite's streaming and batch APIs on the same weights, in a child process (its own CUDA
    context and logging); the child writes its JSON, or why it could not run."""
    args = run.args
    out = run.out / "gsv_lite.json"
    if run.left() < 90:
        run.report["gsv_tts_lite"] = {"ran": False, "reason": f"skipped: {run.left():.0f} s of the budget left "
                                                               f"(run it alone with --gsv only)"}
        run.save()
        return
    weights = run.report.get("weights")
    if weights is None:
        config = weights_config(run)
        run.report["weights"] = weights = str(config)
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gsv_lite_load.py"), "--weights", weights,
           "--ref-dir", str(mix_dir), "--levels", ",".join(map(str, args.gsv_levels or args.levels)),
           "--duration", str(args.duration), "--device", args.device, "--precision", args.precision,
           "--max-tokens", str(args.max_tokens), "--out", str(out), "--budget", str(max(run.left() - 20, 30))]
    run.log("gsv-tts-lite: " + " ".join(cmd[1:]))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
           "PYTHONUNBUFFERED": "1"}
    omp_waits(env, args.omp_wait)
    with open(run.out / "gsv_lite.log", "wb") as log:
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=max(run.left() - 10, 20))
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    try:
        result = json.loads(out.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        result = {"ran": False, "reason": f"the gsv-tts-lite run ended ({code}) without a report; "
                                          f"gsv_lite.log:\n{_tail(run.out / 'gsv_lite.log', 15)}"}
    run.report["gsv_tts_lite"] = result
    run.log("gsv-tts-lite: " + ("ran" if result.get("ran") else f"did not run: {result.get('reason')}"))
    run.save()


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    m = report.get("machine", {})
    lines = [f"### Product path under load ({report['started'][:10]})", "",
             f"Machine: {'; '.join(m.get('gpus', [])) or 'no GPU'}, torch {m.get('torch', '?')}, "
             f"Python {m.get('python', '?')}, {m.get('cpus', '?')} CPUs. Weights: random "
             f"{'tiny' if s['tiny'] else 'full-size'} {s['version']}, {s['precision']} on {s['device']}, "
             f"{s['max_tokens']} semantic tokens per sentence. Closed loop, {s['duration']:g} s per level.", "",
             "```", "python3 benchmarks/product_load.py " + " ".join(_flags(s)), "```", ""]
    if report.get("server_command"):
        lines += [f"Server: `sovits-studio {report['server_command'].split(' ', 2)[-1]}`", ""]
    if report.get("levels"):
        lines += ["#### sovits-studio serve, over HTTP (`loadtest --mix`)", ""]
        lines += render_table(MIX_COLUMNS, mix_rows(report["levels"]), markdown=True)
        lines += ["", mean_audio(report["levels"])]
        lines += ["", machine_load(report["levels"], m.get("cpus"))]
        lines += engine_table(report["levels"])
        lines += ["", "Per mode and language:", ""]
        lines += render_table(BREAKDOWN_COLUMNS, breakdown_rows(report["levels"]), markdown=True)
        after = report.get("after")
        if after:
            r = after["requests"]
            lines += ["", f"After the levels: {r['ok']}/{r['sent']} requests ok one by one, /health "
                          f"{after['health_status']} {after['health'].get('status', '')}: "
                          f"**{'still serves' if after['still_serves'] else 'does not serve'}**."]
    gsv = report.get("gsv_tts_lite")
    if gsv:
        lines += ["", "#### gsv-tts-lite on the same weights, texts and clips (in process)", ""]
        if gsv.get("ran"):
            lines += [gsv.get("how", ""), "", f"Languages: {', '.join(gsv.get('languages', []))}."]
            for lang, why in (gsv.get("excluded_languages") or {}).items():
                lines.append(f"Left out: {lang} ({' '.join(why.split())[:300]}).")
            lines.append("")
            for api in ("batch", "stream"):
                levels = gsv.get(api) or []
                if levels:
                    lines += [f"{api} API:", ""] + render_table(MIX_COLUMNS, mix_rows(levels), markdown=True)
                    lines += ["", mean_audio(levels), ""]
            for note in gsv.get("notes", []):
                lines.append(f"- {note}")
        else:
            lines.append("Not run: " + " ".join(str(gsv.get("reason")).split()))
    if report["notes"]:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in report["notes"]]
    return "\n".join(lines) + "\n"


def machine_load(levels: list[dict[str, Any]], cpus: Any) -> str:
    """Per level: the machine's load average before and after it (on a shared machine other work changes every
    figure) and the server's CPU seconds per audio second (the first level's include the warm-up requests)."""
    parts = []
    for lv in levels:
        load = lv.get("machine_load") or [None, None]
        per = lv.get("server_cpu_per_audio_s")
        parts.append(f"{lv['clients']}: load {load[0]} -> {load[1]}, server {lv.get('server_cpu_s', '?')} CPU s"
                     + (f" ({per:.2f} per audio s)" if per is not None else ""))
    return f"Machine load average ({cpus} CPUs) and server CPU per level: " + "; ".join(parts) + "."


def engine_table(levels: list[dict[str, Any]]) -> list[str]:
    """Per level, what the server's engine did (its /metrics counters between the level's first and last scrape):
    the decode loop's steps, rows, milliseconds and share of the time; the acoustic rounds'; the first chunks'
    wait for their tokens, then for their audio."""
    rows = [(lv["clients"], e) for lv in levels
            if isinstance(lv.get("server_memory"), dict) and (e := lv["server_memory"].get("engine"))]
    if not rows:
        return []
    out = ["", "Engine per level (server /metrics):", "",
           "| clients | decode steps/s | rows/step | ms/step | decode busy | prefills/s | rows/prefill | ms/prefill (host set-up) | "
           "prefill busy | gate wait (steps + prefills) | captures | acoustic rounds/s | chunks/round | ms/round | "
           "acoustic busy | rounds overlapped | first chunk: tokens / audio (s) | "
           "mean requests: reference / first sentence / admitted / decoding / waiting prefill / acoustic jobs | "
           "reference cache hits |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for clients, e in rows:
        out.append(f"| {clients} | {e['decode_steps_per_s']} | {e['rows_per_step']} | {e['ms_per_step']} | "
                   f"{e['decode_busy']} | {e.get('prefills_per_s')} | {e.get('rows_per_prefill')} | "
                   f"{e.get('ms_per_prefill')} ({e.get('ms_setup_per_prefill')}) | {e['prefill_busy']} | {e.get('gate_wait_busy')} | "
                   f"{e.get('acoustic_captures')} | {e['acoustic_rounds_per_s']} | "
                   f"{e['chunks_per_round']} | {e['ms_per_round']} | {e['acoustic_busy']} | "
                   f"{e['rounds_overlapped']} | {e['first_chunk_tokens_s']} / {e['first_chunk_audio_s']} | "
                   f"{e.get('mean_reference')} / {e.get('mean_first_sentence')} / "
                   f"{e.get('mean_admitted')} / {e.get('mean_decoding')} / {e.get('mean_prefill_queue')} / "
                   f"{e.get('mean_acoustic_queue')} | {e.get('reference_hit_ratio')} |")
    return out


def mean_audio(levels: list[dict[str, Any]]) -> str:
    """Audio seconds per completed request, per level (random weights: set by the token cap)."""
    parts = [f"{lv['clients']}: {lv['audio_s'] / lv['completed']:.1f} s" for lv in levels if lv["completed"]]
    return "Mean audio per completed request (clients: seconds): " + (", ".join(parts) or "-") + "."


def _flags(settings: dict[str, Any]) -> list[str]:
    defaults = vars(parse_args([]))
    out = []
    for key, value in settings.items():
        if key == "out" or value == defaults.get(key):
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag)
        elif isinstance(value, (list, tuple)):
            out += [f"{flag}={v}" for v in value] if key == "serve_arg" else [flag, ",".join(map(str, value))]
        else:
            out += [flag, str(value)]
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = Run(args)
    files = raise_open_files_limit(max(max(args.levels), max(args.gsv_levels or (1,))) * 2 + 512)
    run.report["open_files"] = files  # the server child inherits the raised limit
    ref_dir = Path(args.ref_dir) if args.ref_dir else next((Path(d) for d in REF_DIRS if Path(d).is_dir()), None)
    if ref_dir is None:
        raise SystemExit(f"no reference clips: give --ref-dir (looked in {', '.join(REF_DIRS)})")
    mix = load_mix(ref_dir)
    run.report["ref_dir"] = str(ref_dir)
    run.save()
    failed = False
    if args.gsv != "only":
        try:
            server_phase(run, mix)
        except Exception as e:  # noqa: BLE001 - recorded, and the gsv phase still runs
            failed = True
            run.note(f"server phase failed: {type(e).__name__}: {e}")
    try:
        if args.gsv != "off":
            gsv_phase(run, ref_dir)
    finally:
        if run.temp_weights is not None:
            shutil.rmtree(run.temp_weights, ignore_errors=True)
    run.report["finished"] = _utc()
    run.report["elapsed_s"] = round(run.elapsed(), 1)
    run.save()
    print(markdown(run.report))
    after = run.report.get("after")
    return 1 if failed or (args.gsv != "only" and not (after and after["still_serves"])) else 0


if __name__ == "__main__":
    sys.exit(main())
