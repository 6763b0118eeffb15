"""Where one batched acoustic round's time goes: the split of the serving scheduler's acoustic round (the streaming
chunks of many sentence streams voiced together) into its stages, host and device.

Each round gives every stream its next token chunk and runs what the scheduler's acoustic thread runs for it:
``voice_together`` (bucketed, through ``AcousticGraphs`` with ``--graphs``), the audio to the host in one copy
(``tensors_to_host``) and each chunk's peak normalisation (``postprocess``). The streams are staggered, so the
prefixes re-encoded in a round range from one chunk to a whole sentence, as in steady serving; a stream that
reaches its sentence's end starts a new sentence. Full-size random SoVITS weights of ``--version``.

The stages are the profiler ranges the engine marks (``acoustic.*`` in engine/acoustic/streaming.py and the
scheduler):

* ``host_numbers``: every host number of the round (codes, phones, lengths, sub-batch rows, cross-fade and noise
  indices), planned and sent to the device in one copy;
* ``encoders``: the prefix encoders (``ssl_proj``, ``encoder_ssl``, text encoder, MRTE, ``encoder2``) of every
  stream's sentence so far;
* ``crop_noise``: each row's newest frames, the cross-fade with its previous latent, its noise draws;
* ``voice``: the voicing sub-batches; eager, split into ``prior_flow`` (projection, prior sample, flow reversed)
  and ``hifigan`` (the decoder); with graphs, one replay each;
* ``sola``: the SOLA joins of the chunks; ``to_host``: the round's audio to the host (waits for the device);
  ``postprocess``: each chunk's peak normalisation on the host.

Per stage it prints the host (CPU) milliseconds per round and, on CUDA, the device milliseconds of the kernels
launched inside it; then the round's wall time, the audio it made, audio seconds per second, and the share of the
wall time the device was busy with kernels.

    python benchmarks/acoustic_round_split.py --device cuda --precision fp16 --rows 64,256 --graphs --json out.json
    python benchmarks/acoustic_round_split.py --device cpu --precision fp32 --rows 8 --rounds 4   # this CPU
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(1, str(Path(__file__).resolve().parent))  # acoustic_levers (--nwc)

SAMPLE_RATE = 32000  # the output of v1, v2 and v2Pro* SoVITS (hps.data.sampling_rate)
STAGES = ("acoustic.host_numbers", "acoustic.encoders", "acoustic.crop_noise", "acoustic.voice",
          "acoustic.prior_flow", "acoustic.hifigan", "acoustic.sola", "acoustic.to_host", "acoustic.postprocess")


def load_sovits(version: str, device: str, precision: str, root: Path, path: Path | None = None):
    """(runtime, SoVITS module): the file at ``path``, else full-size random weights of ``version`` under ``root``."""
    from engine.loading.sovits import load_sovits as load
    from engine.runtime import resolve_runtime
    from engine.testweights.sovits import write_sovits

    if path is None:
        path = root / f"sovits_{version}_full.pth"
        if not path.exists():
            write_sovits(path, version, full_size=True)
    rt = resolve_runtime(device, precision)
    dtype = rt.dtype_for("sovits")
    return rt, load(path, rt.device, dtype).module.to(rt.device, dtype).eval()


class Streams:
    """``rows`` sentence streams over one model, staggered, each fed chunks of ``chunk`` to ``chunk + 8`` tokens;
    a finished sentence is replaced by a new one of ``sentence`` tokens give or take a quarter."""

    def __init__(self, sovits, rows: int, chunk: int, sentence: int, overlap: int, seed: int = 0) -> None:
        import torch

        self.sovits, self.chunk, self.sentence, self.overlap = sovits, chunk, sentence, overlap
        self.rng = torch.Generator().manual_seed(seed)
        p = next(sovits.parameters())
        self.refer = [torch.randn(1, 1025, 240, generator=self.rng).to(p.device, p.dtype)]
        sv_dim = getattr(sovits.dims, "sv_dim", 0) if sovits.dims.is_pro else 0
        self.sv = [torch.randn(1, sv_dim, generator=self.rng).to(p.device, p.dtype)] if sv_dim else None
        self.streams, self.left = [], []
        for i in range(rows):
            self._new(i)
            for _ in range(i % max(1, sentence // chunk)):  # staggered: row i is i chunks into its sentence
                self.left[i] -= chunk
            self.left[i] = max(self.left[i], chunk)

    def _new(self, i: int) -> None:
        import torch

        from engine.acoustic.streaming import SentenceStream

        n = int(self.sentence * (0.75 + 0.5 * torch.rand(1, generator=self.rng).item()))
        phones = torch.randint(1, 300, (max(16, n // 2),), generator=self.rng)
        gen = torch.Generator(device=next(self.sovits.parameters()).device).manual_seed(len(self.left) + n)
        stream = SentenceStream(self.sovits, phones, self.refer, self.sv, 1.0, self.overlap, gen)
        if i < len(self.streams):
            self.streams[i], self.left[i] = stream, n
        else:
            self.streams.append(stream)
            self.left.append(n)

    def next_chunks(self) -> tuple[list, list]:
        """(streams, chunks) of one round: every stream's next chunk (the last of a sentence marked final)."""
        import torch

        chunks = []
        for i in range(len(self.streams)):
            if self.left[i] <= 0:
                self._new(i)
            n = min(self.left[i], self.chunk + int(torch.randint(0, 9, (1,), generator=self.rng)))
            self.left[i] -= n
            chunks.append((torch.randint(0, 1024, (n,), generator=self.rng).tolist(), self.left[i] <= 0))
        return list(self.streams), chunks


def launch_round(streams: Streams, graphs, device):
    """One acoustic round queued as the scheduler queues it (nothing waits for the device): its Delivery."""
    import torch
    from torch.profiler import record_function

    from engine.acoustic.delivery import Delivery
    from engine.acoustic.streaming import voice_together

    live, chunks = streams.next_chunks()
    with torch.inference_mode():
        audios = voice_together(live, chunks, buckets=True, graphs=graphs, lazy=True)
        with record_function("acoustic.to_host"):
            return Delivery(audios, device)


def deliver(delivery) -> float:
    """A launched round's audio on the host, peak-normalised as the scheduler delivers it: its seconds of audio."""
    from torch.profiler import record_function

    from engine.audio import postprocess

    with record_function("acoustic.to_host"):
        audios = delivery.wait()
    with record_function("acoustic.postprocess"):
        samples = sum(postprocess(a).size for a in audios)
    return samples / SAMPLE_RATE


def one_round(streams: Streams, graphs, device) -> float:
    """One acoustic round as the scheduler runs it without the pipeline; returns the seconds of audio it made."""
    return deliver(launch_round(streams, graphs, device))


def split(rows: int, args, sovits, device) -> list[dict]:
    import torch

    from engine.acoustic.streaming import AcousticGraphs

    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    streams = Streams(sovits, rows, args.chunk, args.sentence, args.overlap)
    graphs = AcousticGraphs(sovits, compile=args.compile) if args.graphs and cuda else None
    capture_s = 0.0
    if graphs is not None:  # every voicing shape and the common encoder shapes, captured up front as in warm-up
        t0 = time.perf_counter()
        graphs.want_voices()
        graphs.want_encoders()
        graphs.capture_wanted()
        capture_s = time.perf_counter() - t0
        print(f"{rows} streams: {graphs.captures} graphs captured up front in {capture_s:.1f} s", flush=True)
    for _ in range(args.warmup):  # first shapes met (plans, allocator, graphs of shapes met)
        one_round(streams, graphs, device)
        if graphs is not None and graphs.wanted:
            graphs.capture_wanted()
    sync()
    return [measure(streams, graphs, device, rows, args, capture_s, pipelined == "on")
            for pipelined in args.pipeline.split(",")]


def measure(streams: Streams, graphs, device, rows: int, args, capture_s: float, pipelined: bool) -> dict:
    """``args.rounds`` rounds under the profiler: one at a time (each delivered before the next is queued), or
    ``pipelined`` as the scheduler's acoustic_pipeline runs them (round N+1 queued before round N is delivered)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    audio = 0.0
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        in_flight = None
        for _ in range(args.rounds):
            if not pipelined:
                audio += one_round(streams, graphs, device)
                continue
            launched = launch_round(streams, graphs, device)
            if in_flight is not None:
                audio += deliver(in_flight)
            in_flight = launched
        if in_flight is not None:
            audio += deliver(in_flight)
        sync()
        walls = [time.perf_counter() - t0]
    events = prof.key_averages()
    n = args.rounds
    stages = {}
    for e in events:  # a range appears twice on CUDA: its host event and its device annotation (kernels inside)
        if e.key not in STAGES:
            continue
        s = stages.setdefault(e.key.removeprefix("acoustic."), {"host_ms": 0.0, "device_ms": 0.0, "calls": 0.0})
        device_us = getattr(e, "device_time_total", 0) or getattr(e, "cuda_time_total", 0) or 0
        s["host_ms"] += e.cpu_time_total / 1e3 / n
        s["device_ms"] = max(s["device_ms"], device_us / 1e3 / n)
        s["calls"] = max(s["calls"], e.count / n)
    stages = {k.removeprefix("acoustic."): stages[k.removeprefix("acoustic.")] for k in STAGES
              if k.removeprefix("acoustic.") in stages}
    kernels_us = 0.0
    if cuda:  # kernels only: not the annotations, whose device time is that of the kernels inside them
        kernels_us = sum((getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0) or 0)
                         for e in events if e.device_type is not None and "cuda" in str(e.device_type).lower()
                         and e.key not in STAGES and not getattr(e, "is_user_annotation", False))
    wall = sum(walls)
    return {"rows": rows, "rounds": n, "graphs": graphs is not None, "pipelined": pipelined, "round_ms": 1e3 * wall / n,
            "capture_s": capture_s, "nwc": args.nwc, "compile": graphs is not None and graphs.compiled, "audio_s_per_round": audio / n, "audio_s_per_s": audio / wall,
            "device_busy": (kernels_us / 1e6 / wall) if cuda else None, "stages": stages}


def table(res: dict) -> str:
    lines = [f"#### {res['rows']} streams, {'graphs' if res['graphs'] else 'eager'}{', NWC' if res['nwc'] else ''}{', compiled voicing' if res.get('compile') else ''}{', pipelined' if res.get('pipelined') else ''}: round {res['round_ms']:.1f} ms, "
             f"{res['audio_s_per_round']:.2f} audio s a round, {res['audio_s_per_s']:.1f} audio-s/s"
             + (f", device busy {100 * res['device_busy']:.0f}% of the wall time" if res["device_busy"] is not None
                else ""), "",
             "| stage | host ms/round | device ms/round | host share of the round |", "|---|---|---|---|"]
    for name, s in res["stages"].items():
        device = f"{s['device_ms']:.2f}" if res["device_busy"] is not None else "-"
        lines.append(f"| {name} | {s['host_ms']:.2f} | {device} | "
                     f"{100 * s['host_ms'] / res['round_ms']:.0f}% |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", default="v2ProPlus")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--rows", default="64,256", help="streams per round, comma-separated")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=6)
    ap.add_argument("--chunk", type=int, default=24, help="tokens per chunk (plus 0-8)")
    ap.add_argument("--sentence", type=int, default=200, help="tokens per sentence (give or take a quarter)")
    ap.add_argument("--overlap", type=int, default=2, help="overlap_length in tokens")
    ap.add_argument("--graphs", action="store_true", help="through AcousticGraphs (CUDA), as serving runs")
    ap.add_argument("--compile", action="store_true",
                    help="with --graphs: the voicing graphs hold the compiled channels-last voicing (as serving's "
                         "acoustic_compile)")
    ap.add_argument("--nwc", action="store_true",
                    help="every convolution on channels-last activations (benchmarks/acoustic_levers.py's lever)")
    ap.add_argument("--pipeline", default="off", choices=("off", "on", "off,on", "on,off"),
                    help="rounds one at a time (off), or each queued before the previous one's audio is delivered "
                         "(on: serving's acoustic_pipeline); off,on: both, over the same graphs")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    import torch

    rt, sovits = load_sovits(args.version, args.device, args.precision, Path(tempfile.mkdtemp(prefix="round-")))
    if args.nwc:
        from acoustic_levers import to_nwc

        to_nwc(sovits)
    report = {"device": torch.cuda.get_device_name(rt.device) if rt.device.type == "cuda" else platform.processor()
              or "cpu", "torch_threads": torch.get_num_threads(), "load_average": os.getloadavg(),
              "args": vars(args), "results": []}
    print(f"device {report['device']}, {args.version} full size, {args.precision}, torch threads "
          f"{report['torch_threads']}, load average {report['load_average'][0]:.1f}", flush=True)
    for rows in (int(x) for x in args.rows.split(",")):
        for res in split(rows, args, sovits, rt.device):
            report["results"].append(res)
            print(table(res) + "\n", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
