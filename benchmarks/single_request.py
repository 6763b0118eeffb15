"""One request alone, where its time goes: the scheduled flow (what every request takes) against the official
flow on the caller's thread (``EngineSettings(scheduler=False)``, FastT2S on CUDA), on the same weights.

For each of ``bench``'s texts (short / medium / long), whole files: wall time, audio, RTF, and the scheduler's
own split of the request (front end of the first sentence, T2S busy time and steps, acoustic busy time); for
the medium text streamed: the first chunk's T2S and acoustic parts. ``--profile`` adds the torch profiler's top
operators of one short request of each flow.

    python benchmarks/single_request.py --device cuda --precision fp16 --repeats 5 --json out.json

Random weights never say EOS, so every sentence runs to ``--tokens`` (25 tokens per second of audio).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _studio(config: str, args, scheduler: bool):
    from engine.options import EngineSettings
    from engine.studio import Studio
    from engine.warmup import WarmupSettings, warm_up

    studio = Studio.from_config(config, device=args.device, precision=args.precision,
                                settings=EngineSettings(scheduler=scheduler))
    report = warm_up(studio, settings=WarmupSettings(languages=(args.lang,)))
    print(f"{'scheduled' if scheduler else 'official'} flow warmed up in {report.seconds:.1f} s "
          f"({report.graphs} graphs, errors {report.errors})", flush=True)
    return studio


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def whole_file(studio, text: str, args, reference) -> dict:
    """One whole-file request: wall, audio and (scheduled flow) the scheduler's split."""
    from engine.options import SynthesisOptions

    sched = next(iter(studio._schedulers.values()), None)
    counters = ("steps", "tokens", "t2s_seconds", "acoustic_seconds", "acoustic_rounds")
    before = {k: getattr(sched, k) for k in counters} if sched else {}
    opts = SynthesisOptions(seed=1, early_stop_num=args.tokens, text_split_method="cut5")
    _sync(args.device)
    t0 = time.perf_counter()
    results = list(studio.synthesize(text, args.lang, reference, opts))
    _sync(args.device)
    wall = time.perf_counter() - t0
    audio = sum(len(r.audio) for r in results) / results[0].sample_rate
    out = {"wall_s": wall, "audio_s": audio, "sentences": len({r.sentence for r in results})}
    if sched:
        out.update({k: getattr(sched, k) - before[k] for k in counters})
    return out


def frontend_seconds(studio, text: str, args) -> float:
    """The text front end of the whole text (split + phones + BERT of every sentence), alone."""
    from engine.options import SynthesisOptions

    cloner = studio.cloner()
    opts = SynthesisOptions(text_split_method="cut5")
    _sync(args.device)
    t0 = time.perf_counter()
    for i, t in enumerate(cloner.split(text, args.lang, opts)):
        cloner._features(i, t, args.lang)
    _sync(args.device)
    return time.perf_counter() - t0


def first_chunk(studio, text: str, args, reference) -> dict:
    from engine.options import SynthesisOptions

    sched = next(iter(studio._schedulers.values()), None)
    opts = SynthesisOptions(seed=1, early_stop_num=args.tokens, streaming_mode=True)
    t0 = time.perf_counter()
    it = studio.synthesize(text, args.lang, reference, opts)
    next(it)
    first = time.perf_counter() - t0
    it.close()
    out = {"first_s": first}
    if sched is not None and sched.first_chunk_parts:
        t2s, acoustic = sched.first_chunk_parts[-1]
        out.update(t2s_part_s=t2s, acoustic_part_s=acoustic)
    return out


def profile_one(studio, text: str, args, reference, rows: int = 30) -> str:
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
    with profile(activities=acts) as prof:
        whole_file(studio, text, args, reference)
    key = "cuda_time_total" if args.device.startswith("cuda") else "cpu_time_total"
    return (prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60) + "\n"
            + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=60))


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> int:
    from studio.bench import TEXTS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", default="v2ProPlus")
    p.add_argument("--tiny", action="store_true", help="tiny random weights (a quick run on a CPU)")
    p.add_argument("--config", default=None, help="an existing tts_infer.yaml instead of random weights")
    p.add_argument("--device", default="cuda")
    p.add_argument("--precision", default="fp16")
    p.add_argument("--lang", default="zh")
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--flows", default="scheduled,official")
    p.add_argument("--profile", default=None, help="write the torch profiler's tables of one short request here")
    p.add_argument("--json", default=None)
    args = p.parse_args()

    from studio.bench import synthetic_reference
    from engine.reference import Reference
    from engine.testweights import make_test_weights

    work = Path(tempfile.mkdtemp(prefix="single-request-"))
    report: dict = {"args": vars(args), "flows": {}}
    try:
        config = args.config or str(make_test_weights(work, args.version, full_size=not args.tiny))
        reference = Reference(str(synthetic_reference(work / "ref.wav")), "今天天气很好，我们一起去公园散步吧。", "zh")
        profiles = []
        for flow in args.flows.split(","):
            studio = _studio(config, args, scheduler=flow == "scheduled")
            whole_file(studio, TEXTS["short"], args, reference)  # the reference prepared and cached
            rows = {}
            for label, text in TEXTS.items():
                fe = statistics.median(frontend_seconds(studio, text, args) for _ in range(3))
                runs = [whole_file(studio, text, args, reference) for _ in range(args.repeats)]
                row = {"wall_s": round(median_of(runs, "wall_s"), 4), "audio_s": round(runs[-1]["audio_s"], 2),
                       "sentences": runs[-1]["sentences"], "frontend_s": round(fe, 4)}
                row["rtf"] = round(row["wall_s"] / row["audio_s"], 4)
                if "steps" in runs[-1]:
                    row.update(t2s_busy_s=round(median_of(runs, "t2s_seconds"), 4),
                               steps=runs[-1]["steps"], tokens=runs[-1]["tokens"],
                               ms_per_step=round(1000 * median_of(runs, "t2s_seconds") / max(1, runs[-1]["steps"]), 3),
                               acoustic_busy_s=round(median_of(runs, "acoustic_seconds"), 4),
                               acoustic_rounds=runs[-1]["acoustic_rounds"])
                rows[label] = row
                print(flow, label, json.dumps(row), flush=True)
            chunks = [first_chunk(studio, TEXTS["medium"], args, reference) for _ in range(args.repeats)]
            rows["first_chunk"] = {k: round(statistics.median(c[k] for c in chunks), 4) for k in chunks[0]}
            print(flow, "first_chunk", json.dumps(rows["first_chunk"]), flush=True)
            if args.profile:
                profiles.append(f"==== {flow} flow, short text ====\n"
                                + profile_one(studio, TEXTS["short"], args, reference))
            report["flows"][flow] = rows
            studio.close()
        if args.profile:
            Path(args.profile).write_text("\n".join(profiles), encoding="utf-8")
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1), encoding="utf-8")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
