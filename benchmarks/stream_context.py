"""Bounded-context token streaming (``EngineSettings.stream_context_tokens``) against the official decode: its speed
and its difference, for one streamed sentence.

The official streaming decode re-encodes the whole sentence so far for every chunk, so a chunk costs more the
further into its sentence it is; with a bound of N tokens a chunk's prefix encoders see at most N tokens before it.
This streams one sentence of ``--tokens`` random tokens (chunks of ``--chunk`` to ``--chunk`` + 8 tokens) through
``SentenceStream`` once per bound (0 = official), with the same noise, and prints per bound: the acoustic seconds
for the sentence, the last chunk's milliseconds, and the difference of the sentence's audio to the official one
(SNR in dB and the largest sample difference).

Random weights: the difference says how far the encoders' attention reaches in a random model, not in a trained
one. Whether a bound is inaudible must be measured on the official pretrained weights (same command with
``--sovits PATH``); until then the default stays the official decode.

    python benchmarks/stream_context.py --device cpu --precision fp32 --tokens 120 --contexts 0,32,64
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def stream_sentence(sovits, phones, refer, sv, chunks, context: int, seed: int, sync) -> tuple[list, float, float]:
    """The played audio of each chunk, the seconds for all, and the milliseconds of the last chunk."""
    import torch

    from engine.acoustic.streaming import SentenceStream

    stream = SentenceStream(sovits, phones, refer, sv, 1.0, 2, torch.Generator(
        device=next(sovits.parameters()).device).manual_seed(seed), context=context)
    out, last = [], 0.0
    sync()
    t0 = time.perf_counter()
    for tokens, final in chunks:
        t = time.perf_counter()
        out.append(stream.voice(tokens, final).float().cpu())
        sync()
        last = time.perf_counter() - t
    return out, time.perf_counter() - t0, 1e3 * last


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", default="v2ProPlus")
    ap.add_argument("--sovits", help="a SoVITS .pth to use instead of full-size random weights")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--chunk", type=int, default=24)
    ap.add_argument("--contexts", default="0,32,64,128")
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    from acoustic_round_split import load_sovits

    rt, sovits = load_sovits(args.version, args.device, args.precision, Path(tempfile.mkdtemp(prefix="ctx-")),
                             Path(args.sovits) if args.sovits else None)
    sync = torch.cuda.synchronize if rt.device.type == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(0)
    p = next(sovits.parameters())
    refer = [torch.randn(1, 1025, 240, generator=g).to(p.device, p.dtype)]
    sv = [torch.randn(1, sovits.dims.sv_dim, generator=g).to(p.device, p.dtype)] if sovits.dims.is_pro else None
    phones = torch.randint(1, 300, (max(16, args.tokens // 2),), generator=g)
    tokens = torch.randint(0, 1024, (args.tokens,), generator=g).tolist()
    chunks, at = [], 0
    while at < len(tokens):
        n = min(len(tokens) - at, args.chunk + int(torch.randint(0, 9, (1,), generator=g)))
        chunks.append((tokens[at:at + n], at + n >= len(tokens)))
        at += n
    report = {"args": vars(args), "load_average": os.getloadavg(), "rows": []}
    official = None
    print(f"{len(chunks)} chunks, {args.tokens} tokens, {args.precision} on {rt.device}; load average "
          f"{os.getloadavg()[0]:.1f}\n\n| context (tokens) | sentence (s) | last chunk (ms) | SNR vs official (dB) | "
          f"max abs difference |\n|---|---|---|---|---|", flush=True)
    with torch.inference_mode():
        stream_sentence(sovits, phones, refer, sv, chunks[:2], 0, 7, sync)  # first calls: kernels, allocator
        for context in (int(c) for c in args.contexts.split(",")):
            audio, seconds, last_ms = stream_sentence(sovits, phones, refer, sv, chunks, context, 7, sync)
            joined = torch.cat(audio)
            if official is None and context == 0:
                official = joined
            row = {"context": context, "sentence_s": seconds, "last_chunk_ms": last_ms}
            if official is not None and joined.shape == official.shape:
                noise = float((joined - official).pow(2).sum())
                row["snr_db"] = math.inf if noise == 0 else 10 * math.log10(float(official.pow(2).sum()) / noise)
                row["max_abs"] = float((joined - official).abs().max())
            report["rows"].append(row)
            print(f"| {context or 'whole (official)'} | {seconds:.2f} | {last_ms:.0f} | "
                  f"{row.get('snr_db', float('nan')):.1f} | {row.get('max_abs', float('nan')):.3g} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
