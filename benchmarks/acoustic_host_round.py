"""The acoustic stage's own host work per batched round, with the device work taken out: the prefix encoders and
the voicing (``encode_prefixes``, ``voice_latents``) are replaced by stand-ins that return zeros of
their shapes at once, so what is timed is everything around them in ``voice_together`` (each stream's plan, the
round's host numbers, the crop and cross-fade, the noise, the SOLA joins of the chunks). Tiny random v2ProPlus
weights on the CPU, one torch thread; every stream gets a chunk of ``--tokens`` tokens a round, bucketed as on
CUDA.

    python benchmarks/acoustic_host_round.py [--rows 8,64] [--rounds 6] [--tokens 24] [--precision fp16]

Prints, per row count, the milliseconds of host work per round and the tensor operations per round that would
launch device work (PyTorch operators other than views, which only make tensor metadata). On a GPU each such
launch costs the host several microseconds, and a copy to the host also waits for the device.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VIEWS = {"aten.slice.Tensor", "aten.select.int", "aten.detach.default", "aten.view.default", "aten.transpose.int",
         "aten.unsqueeze.default", "aten.alias.default", "aten.expand.default", "aten.lift_fresh.default",
         "aten.squeeze.dim", "aten.unbind.int", "aten.split.Tensor", "aten.split_with_sizes.default",
         "aten._unsafe_view.default", "aten.as_strided.default", "aten.permute.default", "aten.t.default"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="8,64")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--precision", choices=("fp32", "fp16"), default="fp32", help="the weights' and audio's dtype")
    args = ap.parse_args()

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    import engine.acoustic.streaming as streaming
    import tests.support.synth as sup
    from engine.cloner import VoiceCloner
    from engine.reference import Reference
    from engine.reference_cache import ReferenceCache

    torch.set_num_threads(1)
    models = sup.studio("v2ProPlus").cloner().models
    sovits = models.sovits if args.precision == "fp32" else copy.deepcopy(models.sovits).half()
    ref = VoiceCloner(models, ReferenceCache()).prepare(Reference(sup.wav_bytes(sup.clip()), sup.REF_TEXT, "en"))
    dtype = next(sovits.parameters()).dtype
    specs = [x.to(dtype) for x in ref.specs]
    sv = [x.to(dtype) for x in ref.sv] if ref.sv is not None else None
    hidden, frame = sovits.enc_p.proj.in_channels, 2 if sovits.dims.semantic_frame_rate == "25hz" else 1
    up = 1
    for rate in sovits.dims.upsample_rates:
        up *= rate

    def encode(sovits, codes, text, lengths, text_lengths, ge):
        return (torch.zeros(codes.shape[0], hidden, codes.shape[1] * frame, dtype=ge.dtype),)

    def voice(sovits, y, lengths, noise, ge, noise_scale):
        return (torch.zeros(y.shape[0], y.shape[-1] * up, dtype=y.dtype),)

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: Counter = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[str(func)] += 1
            return func(*args, **(kwargs or {}))

    g = torch.Generator().manual_seed(0)

    def rounds(rows: int, count: Count | None) -> float:
        streams = [streaming.SentenceStream(sovits, torch.randint(1, 300, (60,), generator=g), specs, sv, 1.0, 2,
                                            torch.Generator().manual_seed(i)) for i in range(rows)]
        for s in streams:
            s.style  # computed once a sentence, before its first round: not the round's work
        spent = 0.0
        for r in range(args.rounds):
            chunks = [([int(x) for x in torch.randint(0, 1024, (args.tokens,), generator=g)], r == args.rounds - 1)
                      for _ in streams]
            start = time.perf_counter()
            if count is None:
                streaming.voice_together(streams, chunks, buckets=True)
            else:
                with count:
                    streaming.voice_together(streams, chunks, buckets=True)
            spent += time.perf_counter() - start
        return spent / args.rounds

    real = streaming.encode_prefixes, streaming.voice_latents
    streaming.encode_prefixes, streaming.voice_latents = encode, voice
    try:
        for rows in (int(r) for r in args.rows.split(",")):
            rounds(rows, None)  # warm
            seconds = rounds(rows, None)
            count = Count()
            rounds(rows, count)
            launches = sum(n for op, n in count.ops.items() if op not in VIEWS) / args.rounds
            print(f"{rows:4d} rows: {1e3 * seconds:.1f} ms of host work per round, {launches:.0f} device operations "
                  f"per round ({launches / rows:.1f} a row)", flush=True)
    finally:
        streaming.encode_prefixes, streaming.voice_latents = real
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
