"""Where a new reference clip's preparation goes, under a burst of clips never seen before (issue 31).

Under load through HTTP, about half of 256 clients' requests waited for their reference (docs/benchmarks.md,
"Where requests wait"): each client uploads a clip of its own, so its first request prepares it. This runs
bursts of ``n`` concurrent ``VoiceCloner.prepare`` calls in one process, each with a new clip (a folder clip
with a few zero samples appended, as ``loadtest --mix`` does), on the engine's reference threads, and times each
stage of a preparation on the thread that ran it:

- waiting for a reference thread (``reference_threads``);
- reading the clip (decoding, checks, resampling);
- the spectrogram and speaker embedding (the embedding in batches across threads on CUDA);
- HuBERT on the prompt audio (batched across threads on CUDA) and its codes;
- the transcript: its reading in a text worker process (g2p), then BERT.

    python benchmarks/reference_split.py --ref-dir ../shared/refset [--bursts 1,16,64] [--device cuda]
        [--precision fp16] [--reference-threads 2] [--text-processes -1] [--tiny]

Prints, per burst, its wall time, references per second, and per stage the mean milliseconds per reference
(stages of one reference may overlap those of others; "waiting" is the time before a thread took it).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class Timers:
    """Per-stage sums of wall seconds and calls, from any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                with self.lock:
                    self.seconds[name] += time.perf_counter() - t0
                    self.calls[name] += 1

        return timed

    def take(self) -> tuple[dict[str, float], dict[str, int]]:
        with self.lock:
            out = dict(self.seconds), dict(self.calls)
            self.seconds.clear()
            self.calls.clear()
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref-dir", required=True, help="a folder of clips with manifest.json (../shared/refset)")
    ap.add_argument("--bursts", default="1,16,64", help="new clips prepared at once, per burst")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--version", default="v2ProPlus")
    ap.add_argument("--tiny", action="store_true", help="tiny random weights (a check of the script)")
    ap.add_argument("--reference-threads", type=int, default=None, help="EngineSettings.reference_threads")
    ap.add_argument("--text-processes", type=int, default=None, help="EngineSettings.text_processes")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()

    import engine.cloner as cloner_module
    from engine.cloner import ReferenceBatches, VoiceCloner
    from engine.options import EngineSettings
    from engine.reference import Reference
    from engine.studio import Studio
    from engine.testweights import make_test_weights
    from engine.text.frontend import TextFrontend
    from engine.text.workers import TextWorkers
    from studio.loadtest.mix import append_silence, load_mix

    mix = load_mix(args.ref_dir)
    knobs = {k: v for k, v in (("reference_threads", args.reference_threads),
                               ("text_processes", args.text_processes)) if v is not None}
    settings = EngineSettings(warmup=False, reference_cache_entries=4096, reference_cache_bytes=16 << 30, **knobs)
    work = Path(tempfile.mkdtemp(prefix="reference-split-"))
    config = make_test_weights(work, args.version, full_size=not args.tiny)
    studio = Studio.from_config(str(config), device=args.device, precision=args.precision, settings=settings)
    timers = Timers()
    # the stages, timed where they run (the module's names, as _build_reference_now calls them)
    cloner_module.read_reference = timers.wrap("read clip", cloner_module.read_reference)
    cloner_module._reference_features = timers.wrap("spectrogram + speaker model", cloner_module._reference_features)
    cloner_module.prompt_codes = timers.wrap("HuBERT codes", cloner_module.prompt_codes)
    VoiceCloner._build_reference = timers.wrap("whole, from the request", VoiceCloner._build_reference)
    VoiceCloner._build_reference_here = timers.wrap("whole, on its thread", VoiceCloner._build_reference_here)
    VoiceCloner._phones_and_bert = timers.wrap("transcript (g2p + BERT)", VoiceCloner._phones_and_bert)
    TextWorkers.read = timers.wrap("transcript g2p (text process)", TextWorkers.read)
    TextFrontend.add_bert = timers.wrap("transcript BERT", TextFrontend.add_bert)
    batches = studio._reference_batches
    studio._reference_batches = ReferenceBatches(timers.wrap("HuBERT (batched)", batches.ssl),
                                                 timers.wrap("speaker model (batched)", batches.sv))
    cloner = studio.cloner()
    print(f"{args.version} {'tiny' if args.tiny else 'full-size'}, {args.device} {args.precision}, "
          f"reference threads {studio.settings.reference_threads}, text processes {studio.settings.text_processes}",
          flush=True)
    serial = 0

    def burst(n: int) -> float:
        nonlocal serial
        refs = []
        for _ in range(n):
            clip = mix.clips[serial % len(mix.clips)]
            refs.append(Reference(append_silence(clip.wav, serial + 1), clip.text, clip.language))
            serial += 1
        errors: list[BaseException] = []

        def prepare(ref: Reference) -> None:
            try:
                cloner.prepare(ref)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=prepare, args=(r,)) for r in refs]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise SystemExit(f"a preparation failed: {type(errors[0]).__name__}: {errors[0]}")
        return time.perf_counter() - t0

    t = burst(len(mix.clips))  # every language's front end and the models' first calls
    timers.take()
    print(f"first burst (each folder clip once, not counted): {t:.2f} s", flush=True)
    results = []
    for n in (int(b) for b in args.bursts.split(",")):
        wall = burst(n)
        seconds, calls = timers.take()
        whole = seconds.get("whole, from the request", 0.0)
        here = seconds.get("whole, on its thread", 0.0)
        stages = {"waiting for a reference thread": whole - here, **seconds}
        row = {"burst": n, "wall_s": round(wall, 3), "references_per_s": round(n / wall, 1),
               "ms_per_reference": {k: round(1e3 * v / n, 1) for k, v in stages.items()},
               "calls": calls}
        results.append(row)
        print(f"\nburst of {n}: {wall:.2f} s wall, {n / wall:.1f} references/s; mean ms per reference:", flush=True)
        for name, v in sorted(row["ms_per_reference"].items(), key=lambda kv: -kv[1]):
            print(f"  {name:34s} {v:9.1f}  ({calls.get(name, '-')} calls)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": vars(args), "bursts": results}, indent=1))
    studio.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
