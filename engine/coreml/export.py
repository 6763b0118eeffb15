"""Convert a vocoder to a Core ML package (mlprogram) with coremltools; runs on Linux and macOS.

Precision plan (one rule for every vocoder, recorded in the package metadata):

* **float16**: convolutions and transposed convolutions with ``groups == 1`` and more than one input
  and output channel, i.e. the learned convs that hold almost all weights and FLOPs (``conv_pre``,
  the upsamplers, the residual-block convs).
* **float32**: everything else: the anti-aliasing Kaiser-sinc filters of BigVGAN (grouped convs),
  the Snake/SnakeBeta activations (``x * alpha``, ``sin``, ``pow`` and the ``1/beta`` scaling:
  in float16 the phase ``x * alpha`` loses about three decimal digits, so the sine becomes noise for
  large ``x``), the residual sums and averages, LeakyReLU, ``conv_post`` (one output channel) and
  the final clamp / tanh. Inputs and outputs are float32.

``--quantize int8`` then stores the float16 convs' weights as per-channel symmetric int8
(coremltools ``linear_quantize_weights``); the anti-aliasing filters stay float32.

Prediction needs macOS. Off macOS the export reports an *estimated* error: the torch vocoder run with
the same precision plan simulated (fp16-rounded conv inputs/weights/outputs, int8-rounded weights)
against the float32 torch vocoder.
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from engine.coreml.package import FORMAT_VERSION, KINDS, META_PREFIX
from engine.errors import CheckpointError, OptionsError

log = logging.getLogger(__name__)

DEFAULT_MAX_FRAMES = 1024  # about 11 s (v3) / 10 s (v4) per call; longer mels are vocoded in windows
DEFAULT_MIN_FRAMES = 16
QUANT_WEIGHT_THRESHOLD = 2048  # coremltools' default: smaller constants stay as they are
PRECISION_TEXT = (
    "float16: convs/transposed convs with groups=1 and >1 input and output channels; "
    "float32: anti-aliasing filters, snake activations (sin), residual sums, leaky_relu, conv_post, clamp/tanh, I/O"
)


@dataclass(frozen=True)
class VocoderToExport:
    kind: str  # "bigvgan" | "v4" | "v2"
    module: nn.Module  # forward(x) or, for v2, forward(z, ge)
    sample_rate: int
    hop: int
    channels: int  # input channels (mel bands or latent channels)
    gin_channels: int = 0  # style-vector width (v2 only)
    source: str = ""


@dataclass(frozen=True)
class ExportReport:
    path: Path
    size_bytes: int
    quantize: str
    fp16_ops: int  # ops the precision rule put in float16
    fp32_ops: int  # compute ops kept in float32
    estimated_rel_error: float  # max |simulated - torch| / max |torch| on a random input (off-Mac estimate)


class _Single(nn.Module):
    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        return self.net(mel)


class _Conditioned(nn.Module):
    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, z: torch.Tensor, ge: torch.Tensor) -> torch.Tensor:
        return self.net(z, g=ge)


def load_vocoder_for_export(kind: str, weights: str | os.PathLike) -> VocoderToExport:
    """The torch vocoder of ``kind`` from its official file(s)."""
    import math

    if kind == "bigvgan":
        from engine.loading.vocoder import load_bigvgan

        net = load_bigvgan(weights)
        d = net.dims
        return VocoderToExport(kind, _Single(net).eval(), d.sampling_rate, d.hop, d.num_mels, source=str(weights))
    if kind == "v4":
        from engine.loading.vocoder import V4VocoderDims, load_v4_vocoder

        net = load_v4_vocoder(weights)
        d = V4VocoderDims()
        return VocoderToExport(kind, _Single(net).eval(), d.sampling_rate, d.hop, net.conv_pre.in_channels,
                               source=str(weights))
    if kind == "v2":
        from engine.loading.sovits import load_sovits

        loaded = load_sovits(weights)
        dec = getattr(loaded.module, "dec", None)
        if dec is None:
            raise CheckpointError(
                f"{weights} is a SoVITS {loaded.model_version} file: it has no HiFi-GAN decoder to export "
                "(--vocoder v2 takes a v1/v2/v2Pro/v2ProPlus SoVITS .pth)"
            )
        dims = loaded.dims
        return VocoderToExport(kind, _Conditioned(dec).eval(), loaded.sampling_rate,
                               math.prod(dims.upsample_rates), dims.inter_channels, dims.gin_channels,
                               source=str(weights))
    raise OptionsError(f"--vocoder must be one of {', '.join(KINDS)}, got {kind!r}")


# ---- the precision rule, on MIL ops and on torch modules -------------------------------------


def _is_learned_conv_shape(weight_shape: tuple[int, ...], groups: int) -> bool:
    return groups == 1 and len(weight_shape) >= 3 and min(weight_shape[0], weight_shape[1]) > 1


def is_float16_op(op) -> bool:
    """coremltools ``op_selector``: True for the ops that run in float16 (see the module docstring)."""
    if op.op_type not in ("conv", "conv_transpose"):
        return False
    groups = op.inputs.get("groups")
    weight = op.inputs.get("weight")
    g = int(groups.val) if groups is not None and groups.val is not None else 1
    return weight is not None and _is_learned_conv_shape(tuple(weight.shape), g)


def _is_float16_module(m: nn.Module) -> bool:
    return isinstance(m, (nn.Conv1d, nn.ConvTranspose1d)) and _is_learned_conv_shape(tuple(m.weight.shape), m.groups)


def _round_int8(w: torch.Tensor, axis: int) -> torch.Tensor:
    """Per-channel symmetric int8 quantise + dequantise along ``axis`` (coremltools linear_symmetric)."""
    dims = tuple(d for d in range(w.dim()) if d != axis)
    scale = w.abs().amax(dim=dims, keepdim=True) / 127.0
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return torch.clamp(torch.round(w / scale), -127, 127) * scale


def simulate_plan(module: nn.Module, quantize: str = "none") -> nn.Module:
    """A copy of ``module`` that computes with the package's precision plan (an estimate of Core ML's numerics)."""
    sim = copy.deepcopy(module).float().eval()
    for m in sim.modules():
        if not _is_float16_module(m):
            continue
        with torch.no_grad():
            w = m.weight
            if quantize == "int8" and w.numel() > QUANT_WEIGHT_THRESHOLD:
                w = _round_int8(w, 1 if isinstance(m, nn.ConvTranspose1d) else 0)
            m.weight.copy_(w.half().float())
            if m.bias is not None:
                m.bias.copy_(m.bias.half().float())
        m.register_forward_pre_hook(lambda _m, args: tuple(a.half().float() for a in args))
        m.register_forward_hook(lambda _m, _args, out: out.half().float())
    return sim


def example_inputs(spec: VocoderToExport, frames: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Deterministic inputs in a realistic range (log-mels around -5, or a unit-scale latent + style)."""
    gen = torch.Generator().manual_seed(seed)
    if spec.kind == "v2":
        z = torch.randn(1, spec.channels, frames, generator=gen)
        ge = torch.randn(1, spec.gin_channels, 1, generator=gen)
        return z, ge
    return (torch.randn(1, spec.channels, frames, generator=gen) * 1.5 - 5.0,)


def estimate_error(spec: VocoderToExport, quantize: str, frames: int = 64) -> float:
    """max |plan - float32| / max |float32| of the torch vocoder on a random input."""
    inputs = example_inputs(spec, frames, seed=1)
    with torch.inference_mode():
        ref = spec.module(*inputs)
        sim = simulate_plan(spec.module, quantize)(*inputs)
    return float((sim - ref).abs().max() / ref.abs().max().clamp_min(1e-12))


# ---- conversion ---------------------------------------------------------------------------------


def _folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def export_vocoder(
    spec: VocoderToExport,
    out: str | os.PathLike,
    quantize: str = "none",
    max_frames: int = DEFAULT_MAX_FRAMES,
    min_frames: int = DEFAULT_MIN_FRAMES,
) -> ExportReport:
    """Trace, convert and save ``spec`` as ``out`` (an ``.mlpackage`` folder, replaced if present)."""
    try:
        import numpy as np

        from engine.coreml import import_coremltools

        ct = import_coremltools()
    except ImportError as e:
        raise OptionsError("Core ML export needs coremltools: pip install 'coremltools>=8,<10'") from e
    if quantize not in ("none", "int8"):
        raise OptionsError(f"--quantize must be 'none' or 'int8', got {quantize!r}")
    if not 1 <= min_frames <= max_frames:
        raise OptionsError(f"need 1 <= min_frames ({min_frames}) <= max_frames ({max_frames})")
    out = Path(out)
    if out.suffix != ".mlpackage":
        raise OptionsError(f"--out must end in .mlpackage, got {out}")

    example = example_inputs(spec, max(min_frames, min(64, max_frames)))
    with torch.no_grad():
        traced = torch.jit.trace(spec.module, example, check_trace=False)
    time_axis = ct.RangeDim(lower_bound=min_frames, upper_bound=max_frames, default=example[0].shape[-1])
    if spec.kind == "v2":
        inputs = [ct.TensorType(name="z", shape=(1, spec.channels, time_axis), dtype=np.float32),
                  ct.TensorType(name="ge", shape=(1, spec.gin_channels, 1), dtype=np.float32)]
    else:
        inputs = [ct.TensorType(name="mel", shape=(1, spec.channels, time_axis), dtype=np.float32)]
    counts = {"fp16": 0, "fp32": 0}

    def selector(op) -> bool:
        half = is_float16_op(op)
        if op.op_type != "const":
            counts["fp16" if half else "fp32"] += 1
        return half

    model = ct.convert(
        traced,
        inputs=inputs,
        outputs=[ct.TensorType(name="audio", dtype=np.float32)],
        convert_to="mlprogram",
        compute_precision=ct.transform.FP16ComputePrecision(op_selector=selector),
        minimum_deployment_target=ct.target.macOS13,
    )
    if quantize == "int8":
        model = _quantize_int8(model)

    meta = {
        "format_version": FORMAT_VERSION,
        "kind": spec.kind,
        "sample_rate": str(spec.sample_rate),
        "hop": str(spec.hop),
        "channels": str(spec.channels),
        "gin_channels": str(spec.gin_channels),
        "min_frames": str(min_frames),
        "max_frames": str(max_frames),
        "quantize": quantize,
        "precision": PRECISION_TEXT,
        "fp16_ops": str(counts["fp16"]),
        "fp32_ops": str(counts["fp32"]),
        "source": Path(spec.source).name,
    }
    estimated = estimate_error(spec, quantize)
    meta["estimated_rel_error"] = f"{estimated:.3g}"
    for k, v in meta.items():
        model.user_defined_metadata[META_PREFIX + k] = v
    model.short_description = f"SoVITS Studio {spec.kind} vocoder, {spec.sample_rate} Hz, {spec.hop} samples per frame"
    model.author = "SoVITS Studio export-coreml"
    first = inputs[0].name
    model.input_description[first] = f"(1, {spec.channels}, T) float32, {min_frames} <= T <= {max_frames}"
    model.output_description["audio"] = f"(1, 1, T * {spec.hop}) float32 waveform at {spec.sample_rate} Hz"
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    model.save(str(out))
    return ExportReport(out, _folder_size(out), quantize, counts["fp16"], counts["fp32"], estimated)


def _quantize_int8(model):
    """int8 weights for the float16 convs; the anti-aliasing filter constants stay as they are."""
    from coremltools.optimize.coreml import OpLinearQuantizerConfig, OptimizationConfig, linear_quantize_weights

    keep: dict[str, None] = {}
    prog = getattr(model, "_mil_program", None)
    if prog is not None:
        for fn in prog.functions.values():
            for op in fn.operations:
                if op.op_type in ("conv", "conv_transpose") and not is_float16_op(op):
                    w = op.inputs.get("weight")
                    if w is not None and w.op is not None:
                        keep[w.op.name] = None
    config = OptimizationConfig(
        global_config=OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int8",
                                              weight_threshold=QUANT_WEIGHT_THRESHOLD),
        op_name_configs=keep,
    )
    return linear_quantize_weights(model, config=config)
