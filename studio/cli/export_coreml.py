"""`sovits-studio export-coreml --vocoder {bigvgan,v4,v2} --weights W --out X.mlpackage [--quantize int8]`."""

from __future__ import annotations

import argparse

VOCODERS = ("bigvgan", "v4", "v2")
WEIGHTS_HELP = (
    "bigvgan: the BigVGAN folder (config.json + bigvgan_generator.pt); "
    "v4: gsv-v4-pretrained/vocoder.pth; v2: a v1/v2/v2Pro/v2ProPlus SoVITS .pth (its HiFi-GAN decoder)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vocoder", required=True, choices=VOCODERS, help="which vocoder to convert")
    parser.add_argument("--weights", required=True, help=WEIGHTS_HELP)
    parser.add_argument("--out", required=True, help="package to write (a .mlpackage folder; replaced if present)")
    parser.add_argument("--quantize", choices=("none", "int8"), default="none",
                        help="int8: per-channel int8 weights for the float16 convs (smaller package)")
    parser.add_argument("--max-frames", type=int, default=None,
                        help="upper bound of the flexible time axis (default 1024); longer mels are vocoded in windows")
    parser.add_argument("--min-frames", type=int, default=None, help="lower bound of the time axis (default 16)")


def run(args: argparse.Namespace) -> int:
    from engine.coreml.export import DEFAULT_MAX_FRAMES, DEFAULT_MIN_FRAMES, export_vocoder, load_vocoder_for_export

    spec = load_vocoder_for_export(args.vocoder, args.weights)
    report = export_vocoder(
        spec,
        args.out,
        quantize=args.quantize,
        max_frames=args.max_frames or DEFAULT_MAX_FRAMES,
        min_frames=args.min_frames or DEFAULT_MIN_FRAMES,
    )
    print(f"wrote {report.path} ({report.size_bytes / 1e6:.2f} MB, weights {report.quantize})")
    print(f"  {spec.kind} vocoder, {spec.sample_rate} Hz, {spec.hop} samples per frame, "
          f"{report.fp16_ops} float16 ops / {report.fp32_ops} float32 ops")
    print(f"  estimated max error vs the float32 torch vocoder: {report.estimated_rel_error:.3g} of full scale "
          "(simulated in torch; measured on macOS when the engine first loads the package)")
    return 0
