"""Concurrent streaming through the scheduler, in process: first-chunk latency, per-stream speed
against real time, T2S tokens/s, the knee where streams fall below real time, and memory over many
requests. Prints a table and JSON.

The workload skips what is not the scheduler's: text (random phone ids, zero BERT features: a
Mandarin-length sentence) and reference preparation (a random 5 s prompt: 125 prompt tokens, a
spectrogram and a speaker embedding, "cached"). Only the GPT and SoVITS weights are needed, so the
random full-size files are written here with ``engine.testweights`` (``--full-size``).

    python benchmarks/serving_streams.py --version v2ProPlus --full-size --precision fp16 \
        --tokens 500 --streams 1,100,250,500,1000,1500 --memory-requests 2000 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.loading.model_pool import MUTE_TOKEN, Models, WeightSet
from engine.options import SynthesisOptions, resolve_plan
from engine.cloner import VoiceCloner, _Sentence
from engine.reference import PreparedReference
from engine.runtime import resolve_runtime
from engine.serving.scheduler import Scheduler, SchedulerConfig
from engine.t2s.decoding import StopRules


class BenchCloner(VoiceCloner):
    """A VoiceCloner whose text frontend is synthetic (random phones, zero BERT) and whose token cap is
    exact (EOS banned until the cap, so every stream makes ``tokens + 1`` tokens)."""

    def __init__(self, models: Models, scheduler: Scheduler, phones: int, tokens: int) -> None:
        self.models, self.scheduler, self.n_phones, self.cap = models, scheduler, phones, tokens
        self.fallback = self._reopen = None  # every stage on the models' device; one scheduler for the run

    def _features(self, index: int, sentence: str, lang: str) -> _Sentence:
        g = torch.Generator().manual_seed(1000 + index)
        phones = tuple(torch.randint(1, 300, (self.n_phones,), generator=g).tolist())
        return _Sentence(index, phones, torch.zeros(self.models.t2s.bert_proj.in_features, len(phones)), "x")

    def _sampling(self, opts):
        params, _ = super()._sampling(opts)
        return params, StopRules(early_stop_num=self.cap, min_steps=self.cap + 1)


def load(version: str, full_size: bool, device: str, precision: str, root: Path) -> Models:
    from engine.loading.sovits import load_sovits
    from engine.loading.t2s import load_t2s
    from engine.testweights.sovits import write_sovits
    from engine.testweights.t2s import write_t2s

    gpt, sovits = root / "gpt.ckpt", root / "sovits.pth"
    if not gpt.exists():
        write_t2s(gpt, "v1" if version == "v1" else "v2", full_size)
        write_sovits(sovits, version, full_size)
    rt = resolve_runtime(device, precision)
    t2s, ckpt = load_t2s(gpt, rt.device, rt.dtype_for("t2s"))
    loaded = load_sovits(sovits, rt.device, rt.dtype_for("sovits"))
    table = t2s.ar_audio_embedding.word_embeddings.weight.detach().float()
    sim = torch.nn.functional.cosine_similarity(table[MUTE_TOKEN].unsqueeze(0), table, dim=-1).cpu()
    weights = WeightSet(gpt=gpt, sovits=sovits, bert=root, ssl=root)
    return Models(weights, rt, t2s, ckpt.early_stop_num, sim, loaded.module.to(rt.device, rt.dtype_for("sovits")),
                  loaded.model_version, loaded.sampling_rate, ssl=None, bert=None, sv=None)


def reference(models: Models, seconds: float = 5.0) -> PreparedReference:
    g = torch.Generator().manual_seed(7)
    dev, dt = models.device, next(models.sovits.parameters()).dtype
    frames = int(seconds * 50)  # 32 kHz, hop 640
    spec = torch.rand(1, 1025, frames, generator=g).to(dev, dt)
    sv = (torch.randn(1, models.sovits.dims.sv_dim, generator=g).to(dev, dt),) if models.sovits.dims.is_pro else None
    prompt = torch.randint(0, 1024, (int(seconds * 25),), generator=g).to(dev)
    phones = tuple(torch.randint(1, 300, (30,), generator=g).tolist())
    return PreparedReference(specs=(spec,), sv=sv, prompt_semantic=prompt, prompt_phones=phones,
                             prompt_bert=torch.zeros(models.t2s.bert_proj.in_features, 30, device=dev),
                             prompt_norm_text="ref")


def one_stream(cloner: BenchCloner, ref: PreparedReference, seed: int, out: dict) -> None:
    opts = SynthesisOptions(streaming_mode=True, seed=seed)
    plan = resolve_plan(opts, cloner.models.version)
    t0 = time.perf_counter()
    arrivals, audio = [], 0.0
    try:
        for r in cloner._serve(["s"], "zh", ref, opts, plan, seed, None):
            arrivals.append((time.perf_counter() - t0, audio))
            audio += len(r.audio) / r.sample_rate
    except Exception as e:  # noqa: BLE001 - counted as an error
        out["error"] = repr(e)
        return
    end = time.perf_counter() - t0
    first = arrivals[0][0]
    # real time: every chunk arrives before the audio before it has played (playback from the first chunk)
    late = max(0.0, max(t - (first + before) for t, before in arrivals))
    out.update(first=first, end=end, audio=audio, speed=audio / end, late=late)


def wave(cloner, ref, n: int, seed0: int) -> dict:
    sched = cloner.scheduler
    outs = [dict() for _ in range(n)]
    threads = [threading.Thread(target=one_stream, args=(cloner, ref, seed0 + i, outs[i])) for i in range(n)]
    steps0, tokens0, t0 = sched.steps, sched.tokens, time.perf_counter()
    busy0 = (sched.t2s_seconds, sched.acoustic_seconds, sched.acoustic_rounds, sched.acoustic_chunks)
    sched.first_chunk_parts.clear()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ok = [o for o in outs if "first" in o]
    firsts = sorted(o["first"] for o in ok)

    def pct(p):
        return firsts[min(len(firsts) - 1, int(math.ceil(p / 100 * len(firsts))) - 1)] if firsts else float("nan")

    speeds = [o["speed"] for o in ok]
    return {
        "streams": n, "errors": n - len(ok),
        "first_chunk_p50_ms": 1000 * pct(50), "first_chunk_p95_ms": 1000 * pct(95),
        "first_chunk_p99_ms": 1000 * pct(99),
        "stream_speed_min": min(speeds) if speeds else 0.0, "stream_speed_median": statistics.median(speeds) if speeds else 0.0,
        "streams_late": sum(o["late"] > 0.0 for o in ok), "worst_late_s": max((o["late"] for o in ok), default=0.0),
        "audio_s_per_s": sum(o["audio"] for o in ok) / wall,
        "t2s_tokens_per_s": (sched.tokens - tokens0) / wall, "decode_steps_per_s": (sched.steps - steps0) / wall,
        "wall_s": wall,
        "t2s_busy_s": sched.t2s_seconds - busy0[0], "acoustic_busy_s": sched.acoustic_seconds - busy0[1],
        "acoustic_rounds": sched.acoustic_rounds - busy0[2],
        "acoustic_jobs_per_round": (sched.acoustic_chunks - busy0[3]) / max(1, sched.acoustic_rounds - busy0[2]),
        "first_chunk_t2s_ms_median": 1000 * statistics.median(p[0] for p in sched.first_chunk_parts)
        if sched.first_chunk_parts else float("nan"),
        "first_chunk_acoustic_ms_median": 1000 * statistics.median(p[1] for p in sched.first_chunk_parts)
        if sched.first_chunk_parts else float("nan"),
    }


def memory() -> dict:
    rss = 0
    try:
        with open("/proc/self/status") as f:
            rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))
    except OSError:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    dev = torch.cuda.memory_allocated() if torch.cuda.is_available() else 0
    return {"rss_mb": rss / 2**20, "device_allocated_mb": dev / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", default="v2ProPlus")
    ap.add_argument("--full-size", action="store_true")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--tokens", type=int, default=500, help="tokens per stream (EOS banned until then)")
    ap.add_argument("--phones", type=int, default=60, help="phones of the target sentence")
    ap.add_argument("--streams", default="1,8", help="concurrent streams per wave, comma separated")
    ap.add_argument("--single-repeats", type=int, default=5, help="waves of 1 stream (first-chunk p50)")
    ap.add_argument("--slots", type=int, default=0)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--memory-requests", type=int, default=0, help="requests for the memory-growth check")
    ap.add_argument("--memory-tokens", type=int, default=50)
    ap.add_argument("--weights", default="", help="folder for the random weights (default: a temporary one)")
    ap.add_argument("--json", default="")
    ap.add_argument("--switch-interval", type=float, default=0.0005,
                    help="sys.setswitchinterval: how soon the decode loop gets the GIL back from other threads")
    args = ap.parse_args()
    sys.setswitchinterval(args.switch_interval)

    root = Path(args.weights or tempfile.mkdtemp(prefix="serving-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    models = load(args.version, args.full_size, args.device, args.precision, root)
    streams = [int(s) for s in args.streams.split(",") if s]
    sched = Scheduler(models, SchedulerConfig(slots=args.slots or max(streams), queue=max(streams),
                                              context=args.context))
    t_capture = time.perf_counter()
    sched.decoder.capture_all()
    capture_s = time.perf_counter() - t_capture
    cloner = BenchCloner(models, sched, args.phones, args.tokens)
    ref = reference(models)
    setup_s = time.perf_counter() - t0
    wave(cloner, ref, 2, 10_000)  # warm-up (kernels, allocator)
    report = {"version": args.version, "full_size": args.full_size, "device": str(models.device),
              "precision": str(models.runtime.dtype_for("t2s")), "tokens_per_stream": args.tokens + 1,
              "slots": sched.slots, "context": args.context, "setup_s": setup_s, "graph_capture_s": capture_s,
              "torch": torch.__version__, "waves": []}
    if torch.cuda.is_available():
        report["gpu"] = torch.cuda.get_device_name()
    singles = [wave(cloner, ref, 1, 20_000 + i) for i in range(args.single_repeats)]
    report["single_first_chunk_ms"] = sorted(w["first_chunk_p50_ms"] for w in singles)
    report["single_first_chunk_p50_ms"] = statistics.median(report["single_first_chunk_ms"])
    report["single_stream_speed"] = statistics.median(w["stream_speed_median"] for w in singles)
    report["single_first_chunk_parts_ms"] = [(round(w["first_chunk_t2s_ms_median"], 1),
                                              round(w["first_chunk_acoustic_ms_median"], 1)) for w in singles]
    for n in streams:
        w = wave(cloner, ref, n, 100_000 * n)
        report["waves"].append(w)
        print(json.dumps(w), flush=True)
    knee = [w["streams"] for w in report["waves"] if w["streams_late"] == 0 and w["errors"] == 0]
    report["most_streams_all_real_time"] = max(knee) if knee else 0
    if args.memory_requests:
        cloner.cap = args.memory_tokens
        per_wave = max(streams)
        done, samples = 0, []
        while done < args.memory_requests:
            n = min(per_wave, args.memory_requests - done)
            wave(cloner, ref, n, 1_000_000 + done)
            done += n
            samples.append({"requests": done, **memory()})
        first, last = samples[0], samples[-1]
        report["memory"] = {"samples": samples, "rss_growth_pct": 100 * (last["rss_mb"] / first["rss_mb"] - 1),
                            "device_growth_pct": 100 * (last["device_allocated_mb"] / max(1e-9, first["device_allocated_mb"]) - 1)}
    sched.close()
    print("\n| streams | first chunk p50 / p95 / p99 (ms) | stream speed min / median (x real time) | streams late | "
          "audio s/s | T2S tokens/s | steps/s |")
    print("|---|---|---|---|---|---|---|")
    for w in report["waves"]:
        print(f"| {w['streams']} | {w['first_chunk_p50_ms']:.0f} / {w['first_chunk_p95_ms']:.0f} / "
              f"{w['first_chunk_p99_ms']:.0f} | {w['stream_speed_min']:.2f} / {w['stream_speed_median']:.2f} | "
              f"{w['streams_late']} | {w['audio_s_per_s']:.1f} | {w['t2s_tokens_per_s']:.0f} | "
              f"{w['decode_steps_per_s']:.0f} |")
    print("\n| streams | T2S busy s | acoustic busy s | acoustic rounds | jobs/round | first chunk: T2S ms | "
          "first chunk: acoustic ms |")
    print("|---|---|---|---|---|---|---|")
    for w in report["waves"]:
        print(f"| {w['streams']} | {w['t2s_busy_s']:.1f} | {w['acoustic_busy_s']:.1f} | {w['acoustic_rounds']} | "
              f"{w['acoustic_jobs_per_round']:.1f} | {w['first_chunk_t2s_ms_median']:.0f} | "
              f"{w['first_chunk_acoustic_ms_median']:.0f} |")
    print(f"\nsingle stream: first chunk p50 {report['single_first_chunk_p50_ms']:.1f} ms "
          f"({', '.join(f'{x:.1f}' for x in report['single_first_chunk_ms'])}), speed {report['single_stream_speed']:.2f}x; "
          f"(T2S, acoustic) ms per run: {report['single_first_chunk_parts_ms']}")
    print(f"most concurrent streams all at real time: {report['most_streams_all_real_time']}")
    if "memory" in report:
        m = report["memory"]
        print(f"memory over {args.memory_requests} requests: RSS {m['samples'][0]['rss_mb']:.0f} -> "
              f"{m['samples'][-1]['rss_mb']:.0f} MB ({m['rss_growth_pct']:+.1f}%), device allocated "
              f"{m['samples'][0]['device_allocated_mb']:.0f} -> {m['samples'][-1]['device_allocated_mb']:.0f} MB "
              f"({m['device_growth_pct']:+.1f}%)")
    print(json.dumps(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
