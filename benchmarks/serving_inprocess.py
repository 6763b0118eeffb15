"""Many clients in one process through the product path: threads calling ``Studio.synthesize`` with the real
text front end (Mandarin, English, Japanese), a reference clip of their own, streaming or whole-file, in a
closed loop. Reports audio seconds per second, first-chunk latency, each stream's speed against real time
and where the scheduler's time went; ``--pyspy`` samples the process (which thread holds the GIL, in what).

    python benchmarks/serving_inprocess.py --version v2ProPlus --full-size --device cuda --precision fp16 \\
        --clients 1,8,64 --duration 15 --tokens 200 --json out.json

Random weights never say EOS, so every sentence runs to ``--tokens`` (25 tokens per second of audio).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TEXTS = (  # (language, text): a medium text of two sentences in each language
    ("zh", "这是一个用于测试语音合成速度的句子。我们希望它听起来自然流畅，并且速度足够快。"),
    ("en", "This sentence measures how fast the voice is made. We hope it sounds natural and arrives in time."),
    ("ja", "これは音声合成の速さを測るための文です。自然に聞こえて、十分に速いことを願っています。"),
)
REF_TEXT = ("今天天气很好，我们一起去公园散步吧。", "zh")


def client_clip(index: int, seconds: float = 5.0, rate: int = 32000) -> bytes:
    """A voiced-like clip of its own per client (pitch, vibrato and noise from the index), WAV bytes."""
    import soundfile as sf

    rng = np.random.default_rng(index)
    t = np.arange(int(seconds * rate)) / rate
    f0 = 100 + 3.7 * (index % 40)
    phase = 2 * np.pi * np.cumsum(f0 * (1 + 0.04 * np.sin(2 * np.pi * (3 + index % 5) * t))) / rate
    x = sum(np.sin(k * phase) / k for k in range(1, 9)) * (0.35 + 0.65 * np.sin(np.pi * 3.0 * t) ** 2)
    x = 0.25 * x / np.abs(x).max() + 0.002 * rng.standard_normal(t.size)
    buf = io.BytesIO()
    sf.write(buf, x.astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def one_request(studio, i: int, n: int, stream: bool, tokens: int, clip: bytes, texts=TEXTS) -> dict:
    from engine.options import SynthesisOptions
    from engine.reference import Reference

    lang, text = texts[(i + n) % len(texts)]
    opts = SynthesisOptions(streaming_mode=stream, seed=1000 * i + n, early_stop_num=tokens)
    t0 = time.perf_counter()
    first, audio, arrivals = None, 0.0, []
    try:
        for r in studio.synthesize(text, lang, Reference(clip, *REF_TEXT), opts):
            now = time.perf_counter() - t0
            first = now if first is None else first
            arrivals.append((now, audio))
            audio += len(r.audio) / r.sample_rate
    except Exception as e:  # noqa: BLE001 - counted
        return {"error": f"{type(e).__name__}: {e}"[:200], "wall": time.perf_counter() - t0}
    wall = time.perf_counter() - t0
    late = max((t - (first + before) for t, before in arrivals), default=0.0)
    return {"first": first, "wall": wall, "audio": audio, "speed": audio / wall if wall else 0.0,
            "late": max(0.0, late), "lang": lang}


def profile_kernels(studio, seconds: float, start_after: float) -> dict:
    """The device kernels of every thread over ``seconds`` (after ``start_after``): busy share and the top ones.
    The profiler synchronises the whole device, which a CUDA graph capture on another thread forbids: it starts
    and stops inside a work section of the engine's device gate (no capture runs meanwhile)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    time.sleep(start_after)
    prof = profile(activities=[ProfilerActivity.CUDA])
    with studio.gate.work():
        prof.start()
    time.sleep(seconds)
    with studio.gate.work():
        torch.cuda.synchronize()
        prof.stop()
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    busy = sum(e.device_time_total for e in events) / 1e6
    top = sorted(events, key=lambda e: -e.device_time_total)[:25]
    return {"window_s": seconds, "kernel_busy_s": round(busy, 3),
            "top": [(e.key[:90], e.count, round(e.device_time_total / 1e3, 1)) for e in top]}


def level(studio, clients: int, duration: float, stream: bool, tokens: int, clips: list[bytes],
          pyspy: tuple[str, float] | None, torch_profile: bool = False, texts=TEXTS) -> dict:
    scheds = list(studio._schedulers.values())
    sched = scheds[0] if scheds else None
    counters = ("steps", "tokens", "t2s_seconds", "acoustic_seconds", "acoustic_rounds", "acoustic_chunks",
                "prefill_seconds", "prefills")
    before = [getattr(sched, k) for k in counters] if sched else None
    records: list[dict] = []
    lock = threading.Lock()
    deadline = time.perf_counter() + duration

    def client(i: int) -> None:
        n = 0
        while time.perf_counter() < deadline:
            r = one_request(studio, i, n, stream, tokens, clips[(i * 7919 + n) % len(clips)], texts)
            n += 1
            with lock:
                records.append(r)

    spy = None
    if pyspy is not None:
        spy = subprocess.Popen([pyspy[0], "record", "--pid", str(os.getpid()), "--duration", str(int(pyspy[1])),
                                "--format", "raw", "--gil", "--threads", "--nonblocking", "--rate", "200",
                                "--output", pyspy[2]], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    cpu0, t0 = time.process_time(), time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    kernels = profile_kernels(studio, min(3.0, duration / 3), start_after=duration / 3) if torch_profile else None
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if spy is not None:
        spy.wait(timeout=120)
    ok = [r for r in records if "error" not in r]
    errors = [r["error"] for r in records if "error" in r]
    firsts = sorted(r["first"] for r in ok)
    out = {"clients": clients, "mode": "stream" if stream else "whole", "requests": len(records), "ok": len(ok),
           "errors": len(errors), "error_examples": sorted(set(errors))[:3], "wall_s": round(wall, 2),
           "audio_s_per_s": round(sum(r["audio"] for r in ok) / wall, 2),
           "first_p50_ms": round(1000 * statistics.median(firsts), 1) if firsts else None,
           "first_p95_ms": round(1000 * firsts[max(0, -(-95 * len(firsts) // 100) - 1)], 1) if firsts else None,
           "slowest_speed": round(min((r["speed"] for r in ok), default=0.0), 2),
           "late_streams": sum(1 for r in ok if r["late"] > 0.05), "cpu_s": round(time.process_time() - cpu0, 1)}
    if kernels is not None:
        out["kernels"] = kernels
    if sched is not None:
        d = [getattr(sched, k) - b for k, b in zip(counters, before)]
        out.update(decode_steps=d[0], t2s_tokens_per_s=round(d[1] / wall), t2s_busy_s=round(d[2], 2),
                   acoustic_busy_s=round(d[3], 2), acoustic_rounds=d[4],
                   chunks_per_round=round(d[5] / d[4], 1) if d[4] else 0, prefill_busy_s=round(d[6], 2),
                   prefills=d[7])
        graphs = getattr(sched, "acoustic_graphs", None)
        if graphs is not None:  # totals since start: graphs held, replays and eager calls per stage
            out["acoustic_graphs"] = {name: {"graphs": len(bank), "replays": bank.replays, "eager": bank.eager}
                                      for name, bank in (("encoders", graphs.encoders), ("voices", graphs.voices))}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", default="v2ProPlus")
    p.add_argument("--full-size", action="store_true")
    p.add_argument("--config", default=None, help="an existing tts_infer.yaml instead of random weights")
    p.add_argument("--device", default="cuda")
    p.add_argument("--precision", default="fp16")
    p.add_argument("--clients", default="1,8,64")
    p.add_argument("--duration", type=float, default=15.0)
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--mode", choices=("stream", "whole", "both"), default="stream")
    p.add_argument("--langs", default="zh,en,ja", help="text languages, taken in turn")
    p.add_argument("--convs", default="auto", help="EngineSettings.conv_backend: auto, cudnn, native")
    p.add_argument("--context", type=int, default=2048, help="EngineSettings.scheduler_context")
    p.add_argument("--acoustic-graphs", choices=("on", "off"), default="on", help="EngineSettings.acoustic_graphs")
    p.add_argument("--clips", type=int, default=256, help="distinct client clips (the reference cache misses)")
    p.add_argument("--pyspy", default=None, help="py-spy binary: sample the GIL holder during one level")
    p.add_argument("--pyspy-level", type=int, default=8, help="the client count sampled by --pyspy")
    p.add_argument("--pyspy-out", default="pyspy.txt")
    p.add_argument("--torch-profile", default="", help="client counts whose device kernels are profiled (CUDA)")
    p.add_argument("--json", default=None)
    args = p.parse_args()

    from engine.options import EngineSettings
    from engine.studio import Studio
    from engine.readiness import Readiness
    from engine.testweights import make_test_weights
    from engine.warmup import WarmupSettings, warm_up

    work = Path(tempfile.mkdtemp(prefix="inprocess-"))
    try:
        t0 = time.perf_counter()
        config = args.config or str(make_test_weights(work, args.version, full_size=args.full_size))
        studio = Studio.from_config(config, device=args.device, precision=args.precision, settings=EngineSettings(
            conv_backend=args.convs, scheduler_context=args.context, acoustic_graphs=args.acoustic_graphs == "on"))
        studio.readiness = Readiness()
        langs = tuple(args.langs.split(","))
        texts = tuple(t for t in TEXTS if t[0] in langs)
        report = warm_up(studio, settings=WarmupSettings(languages=langs))
        studio.readiness.finish()
        setup = time.perf_counter() - t0
        print(f"setup {setup:.1f} s; warm-up {report.seconds:.1f} s, {report.graphs} graphs, errors {report.errors}",
              flush=True)
        clips = [client_clip(i) for i in range(args.clips)]
        modes = (True, False) if args.mode == "both" else (args.mode == "stream",)
        levels = []
        for stream in modes:
            for n in (int(c) for c in args.clients.split(",")):
                spy = ((args.pyspy, min(args.duration, 10), args.pyspy_out)
                       if args.pyspy and n == args.pyspy_level and stream == modes[0] else None)
                prof = str(n) in args.torch_profile.split(",")
                levels.append(level(studio, n, args.duration, stream, args.tokens, clips, spy, prof, texts))
                print(json.dumps({k: v for k, v in levels[-1].items()}), flush=True)
        print(f"serving events: {studio.serving_events()}; state {studio.serving_state}")
        result = {"args": vars(args), "setup_s": setup, "warmup": report.__dict__, "levels": levels,
                  "events": studio.serving_events()}
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1), encoding="utf-8")
        studio.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
