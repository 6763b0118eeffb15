"""The acoustic stage's voicing (``voice_latents``: the prior's sample, the flow reversed and the masked HiFi-GAN
decoder, what the serving scheduler replays per sub-batch of streamed chunks) under each speed lever, on the same
inputs, with its speed and its difference to the eager fp32 decode.

Levers (``--levers``, comma-separated; each is a precision and a way to run):

* ``fp32``, ``fp16``, ``bf16``: eager, the module in that dtype (``fp32`` is the reference of the differences);
* ``*-graph``: the same, replayed as one CUDA graph (``engine.acoustic.graphs.capture_cuda``, as serving does);
* ``*-nwc``: every Conv1d / ConvTranspose1d run as a 2-D convolution on channels-last (NWC) activations, so that
  cuDNN's tensor-core kernels need no NCW<->NWC transposes around each convolution (the activations stay NWC
  between convolutions); ``*-nwc-graph`` replays it;
* ``*-compile``: ``torch.compile`` (inductor, static shapes, ``--compile-mode``), then replayed as a CUDA graph.

Full-size random SoVITS weights of ``--version``; the rows are right-padded streamed chunks of ``--width`` output
frames (each row's length drawn from the last quarter of the width), with each row's own style vector. Per lever
and row count it prints ms per call (median of ``--calls``), audio seconds per second of the sub-batch, and the
SNR (dB) and largest difference of the valid samples to the eager fp32 decode.

    python benchmarks/acoustic_levers.py --device cuda --rows 32,64 --json out.json
    python benchmarks/acoustic_levers.py --device cuda --levers fp16-compile --compile-mode max-autotune-no-cudagraphs
    python benchmarks/acoustic_levers.py --device cpu --rows 2 --width 16 --levers fp32,bf16,fp32-nwc --calls 2
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SAMPLE_RATE = 32000
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def nwc_conv_forward(conv):
    """A forward for ``conv`` (Conv1d or ConvTranspose1d, no groups other than 1 needed) that runs it as the 2-D
    convolution of a (B, C, 1, T) channels-last view: the same numbers, the activations kept NWC in memory."""
    import torch
    from torch.nn import functional as F

    transposed = isinstance(conv, torch.nn.ConvTranspose1d)
    weight = conv.weight.detach().unsqueeze(2).contiguous(memory_format=torch.channels_last)
    bias = None if conv.bias is None else conv.bias.detach()
    stride, padding, dilation = (1, conv.stride[0]), (0, conv.padding[0]), (1, conv.dilation[0])

    def forward(self, x):
        x4 = x.unsqueeze(2).contiguous(memory_format=torch.channels_last)  # a view when x is already NWC
        if transposed:
            out = F.conv_transpose2d(x4, weight, bias, stride, padding, (0, conv.output_padding[0]), conv.groups,
                                     dilation)
        else:
            out = F.conv2d(x4, weight, bias, stride, padding, dilation, conv.groups)
        return out.squeeze(2)

    return forward


def to_nwc(module):
    """``module`` with every Conv1d / ConvTranspose1d running NWC (:func:`nwc_conv_forward`), in place."""
    import torch

    for m in module.modules():
        if isinstance(m, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)) and m.padding_mode == "zeros":
            m.forward = types.MethodType(nwc_conv_forward(m), m)
    return module


def inputs(sovits, rows: int, width: int, seed: int = 0):
    """(y, lengths, noise, ge): ``rows`` right-padded latent rows as the scheduler's voicing sub-batch gets them."""
    import torch

    g = torch.Generator().manual_seed(seed)
    hidden = sovits.enc_p.proj.in_channels
    gin = sovits.dec.cond.in_channels
    lengths = torch.randint(max(1, 3 * width // 4), width + 1, (rows,), generator=g)
    lengths[0] = width
    y = torch.randn(rows, hidden, width, generator=g)
    noise = torch.randn(rows, sovits.enc_p.out_channels, width, generator=g)
    ge = torch.randn(rows, gin, 1, generator=g)
    return y, lengths, noise, ge


def snr_db(ref, out, lengths, upsample: int) -> tuple[float, float]:
    """SNR (dB) of ``out`` against ``ref`` over each row's valid samples, and the largest absolute difference."""
    import torch

    mask = torch.arange(ref.shape[-1])[None, :] < (lengths[:, None] * upsample)
    r, o = ref.float()[mask], out.float()[mask]
    err = (r - o).pow(2).sum().item()
    sig = r.pow(2).sum().item()
    return (math.inf if err == 0 else 10 * math.log10(sig / err)), (r - o).abs().max().item()


def run_lever(lever: str, path: Path, args, rows: int, ref_cache: dict) -> dict:
    import torch

    from engine.acoustic.graphs import capture_cuda
    from engine.acoustic.streaming import voice_latents
    from engine.loading.sovits import load_sovits

    precision, _, how = lever.partition("-")
    device = torch.device(args.device)
    dtype = getattr(torch, DTYPES[precision])
    sovits = load_sovits(path, device, dtype).module.to(device, dtype).eval()
    if "nwc" in how:
        to_nwc(sovits)
    upsample = math.prod(sovits.dec.ups[i].stride[0] for i in range(len(sovits.dec.ups)))
    y, lengths, noise, ge = inputs(sovits, rows, args.width)
    example = (y.to(device, dtype), lengths.to(device), noise.to(device, dtype), ge.to(device, dtype))

    def fn(y, lengths, noise, ge):
        return voice_latents(sovits, y, lengths, noise, ge, args.noise_scale)

    t0 = time.perf_counter()
    call = fn
    if "compile" in how:
        compiled = torch.compile(fn, mode=args.compile_mode, dynamic=False, fullgraph=False)
        call = compiled
    with torch.inference_mode():
        if "graph" in how or "compile" in how:
            if device.type != "cuda":
                raise SystemExit(f"{lever}: graphs need CUDA")
            call(*example)  # compile (when compiled) and the first plans, outside the capture
            replay, _, static_out = capture_cuda(call, example, (), torch.cuda.graph_pool_handle())

            def call(*_):
                replay()
                return static_out
        out = call(*example)[0]
        if device.type == "cuda":
            torch.cuda.synchronize()
    prepare_s = time.perf_counter() - t0
    times = []
    with torch.inference_mode():
        for _ in range(args.warmup):
            call(*example)
        for _ in range(args.calls):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            out = call(*example)[0]
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        out = out.float().cpu()
    ms = 1e3 * sorted(times)[len(times) // 2]
    audio_s = lengths.sum().item() * upsample / SAMPLE_RATE
    res = {"lever": lever, "rows": rows, "width": args.width, "ms": ms, "audio_s": audio_s,
           "audio_s_per_s": audio_s / (ms / 1e3), "prepare_s": prepare_s}
    key = (rows, args.width)
    if lever == "fp32":
        ref_cache[key] = out
    if key in ref_cache:
        res["snr_db"], res["max_abs_diff"] = snr_db(ref_cache[key], out, lengths, upsample)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", default="v2ProPlus")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rows", default="32,64", help="rows of a voicing sub-batch, comma-separated")
    ap.add_argument("--width", type=int, default=64, help="output latent frames of the sub-batch (a chunk: ~50)")
    ap.add_argument("--levers", default="fp32,fp16,bf16,fp16-graph,bf16-graph,fp16-nwc,fp16-nwc-graph")
    ap.add_argument("--compile-mode", default="default", help="torch.compile mode of the *-compile levers")
    ap.add_argument("--noise-scale", type=float, default=0.5)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    import torch

    from engine.testweights.sovits import write_sovits

    path = Path(tempfile.mkdtemp(prefix="levers-")) / f"sovits_{args.version}_full.pth"
    write_sovits(path, args.version, full_size=True)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"device {name}, {args.version} full size, width {args.width} frames, torch {torch.__version__}",
          flush=True)
    print("| rows | lever | ms/call | audio-s/s | SNR vs fp32 eager (dB) | max abs diff | prepare s |")
    print("|---|---|---|---|---|---|---|", flush=True)
    levers = args.levers.split(",")
    if "fp32" not in levers:
        levers = ["fp32", *levers]
    report = {"device": name, "torch": torch.__version__, "args": vars(args), "results": []}
    refs: dict = {}
    for rows in (int(r) for r in args.rows.split(",")):
        for lever in levers:
            try:
                r = run_lever(lever, path, args, rows, refs)
            except Exception as e:  # noqa: BLE001 (one lever failing leaves the others measured)
                print(f"| {rows} | {lever} | failed: {type(e).__name__}: {str(e)[:200]} |", flush=True)
                report["results"].append({"lever": lever, "rows": rows, "error": f"{type(e).__name__}: {e}"})
                continue
            report["results"].append(r)
            snr = r.get("snr_db")
            print(f"| {rows} | {lever} | {r['ms']:.2f} | {r['audio_s_per_s']:.0f} | "
                  f"{'-' if snr is None else ('exact' if snr == math.inf else f'{snr:.1f}')} | "
                  f"{r.get('max_abs_diff', float('nan')):.2e} | {r['prepare_s']:.1f} |", flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
