"""Which vocoder runs: the torch module or a Core ML package (config key ``vocoder_backend``).

Two steps, both testable with the platform faked:

1. :func:`decide_backend` is a pure function of (requested backend, platform, what is available).
   Off macOS, or without coremltools or a package, a ``coreml`` request becomes ``torch`` with one
   clear reason.
2. :func:`select_vocoder` carries the decision out: it loads the package (identity checked against
   the vocoder it replaces), runs it once on a short input next to the torch vocoder, and keeps it
   only if the relative difference is within the tolerance. Every fallback is logged once, with
   its reason, on the ``engine.acoustic.vocoder_backend`` logger.
"""

from __future__ import annotations

import logging
import platform
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.errors import CheckpointError, ConfigError

log = logging.getLogger(__name__)

BACKENDS = ("torch", "coreml")
DEFAULT_TOLERANCE = {"none": 0.05, "int8": 0.10}  # max |coreml - torch| / max |torch| on the probe input
PROBE_FRAMES = 32


@dataclass(frozen=True)
class BackendDecision:
    backend: str  # "torch" | "coreml"
    reason: str = ""  # why the request was not honoured ("" when it was)

    @property
    def fell_back(self) -> bool:
        return bool(self.reason)


def current_system() -> str:
    """``platform.system()`` ("Darwin" on macOS); the default for the functions below."""
    return platform.system()


def coremltools_available() -> bool:
    from engine.coreml import import_coremltools

    try:
        import_coremltools()
    except ImportError:
        return False
    return True


def coreml_unavailable(system: str | None = None, coremltools_ok: bool | None = None) -> str:
    """Why no Core ML vocoder can run on this machine at all ("" when one can, given a package): off macOS, or
    without coremltools. ``system``/``coremltools_ok`` default to the real machine (coremltools is imported only
    on macOS)."""
    system = current_system() if system is None else system
    if system != "Darwin":
        return f"Core ML runs only on macOS (this is {system or 'an unknown system'})"
    if not (coremltools_available() if coremltools_ok is None else coremltools_ok):
        return "coremltools is not installed (pip install coremltools, or the [coreml] extra)"
    return ""


def decide_backend(requested: str, system: str, coremltools_ok: bool, package: str | None) -> BackendDecision:
    """Pure decision: ``requested`` in BACKENDS, ``system`` as ``platform.system()``."""
    if requested not in BACKENDS:
        raise ConfigError(f"vocoder_backend must be one of {', '.join(BACKENDS)}, got {requested!r}")
    if requested == "torch":
        return BackendDecision("torch")
    if system != "Darwin":
        return BackendDecision("torch", f"vocoder_backend 'coreml' needs macOS (this is {system or 'unknown'}); using the torch vocoder")
    if not coremltools_ok:
        return BackendDecision("torch", "vocoder_backend 'coreml' needs coremltools (pip install coremltools); using the torch vocoder")
    if not package:
        return BackendDecision(
            "torch",
            "vocoder_backend 'coreml' needs a package (export one with `sovits-studio export-coreml`); using the torch vocoder",
        )
    return BackendDecision("coreml")


def relative_error(candidate: torch.Tensor, reference: torch.Tensor) -> float:
    """max |candidate - reference| / max |reference| over the common length."""
    n = min(candidate.shape[-1], reference.shape[-1])
    a, b = candidate[..., :n].float().cpu(), reference[..., :n].float().cpu()
    if a.shape != b.shape:
        return float("inf")
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def probe_inputs(channels: int, gin_channels: int = 0, frames: int = PROBE_FRAMES, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Short deterministic inputs: a log-mel-like (1, channels, frames), or for the v2 decoder a latent + style vector."""
    gen = torch.Generator().manual_seed(seed)
    if gin_channels:
        return torch.randn(1, channels, frames, generator=gen), torch.randn(1, gin_channels, 1, generator=gen)
    return (torch.randn(1, channels, frames, generator=gen) * 1.5 - 5.0,)


def _on_its_device(vocoder: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``vocoder`` taking float32 host tensors: moved to its weights' device and dtype (MPS, fp16), back as float32."""
    weights = next(iter(vocoder.parameters()), None) if isinstance(vocoder, torch.nn.Module) else None
    if weights is None:
        return vocoder

    def call(*inputs: torch.Tensor) -> torch.Tensor:
        return vocoder(*(x.to(weights.device, weights.dtype) for x in inputs)).float().cpu()

    return call


@dataclass(frozen=True)
class SelectedVocoder:
    vocoder: Callable[..., torch.Tensor]  # mel -> audio, or (z, ge) -> audio for the v2 decoder
    backend: str
    reason: str = ""  # why Core ML was not used, when it was requested
    probe_error: float | None = None  # measured relative difference on the probe input


def select_vocoder(
    requested: str,
    torch_vocoder: Callable[..., torch.Tensor],
    *,
    kind: str,
    sample_rate: int,
    hop: int,
    channels: int,
    package: str | None = None,
    gin_channels: int = 0,
    system: str | None = None,
    coremltools_ok: bool | None = None,
    load_package: Callable[..., Callable[..., torch.Tensor]] | None = None,
    tolerance: float | None = None,
) -> SelectedVocoder:
    """The vocoder to use for mel->audio, honouring ``requested`` where it works (see the module docstring).

    ``gin_channels`` > 0 marks the v2 decoder, called as ``vocoder(z, ge)``. ``system``,
    ``coremltools_ok`` and ``load_package`` default to the real machine; tests pass fakes.
    Bad configuration values raise ConfigError; anything wrong with the package falls back to torch.
    """
    system = current_system() if system is None else system
    coremltools_ok = coremltools_available() if coremltools_ok is None else coremltools_ok
    decision = decide_backend(requested, system, coremltools_ok, package)
    if decision.backend == "torch":
        if decision.fell_back:
            log.warning(decision.reason)
        return SelectedVocoder(torch_vocoder, "torch", decision.reason)

    if load_package is None:
        from engine.coreml.package import load_coreml_vocoder as load_package
    try:
        candidate = load_package(package, kind=kind, sample_rate=sample_rate, hop=hop, channels=channels)
    except CheckpointError as e:
        reason = f"Core ML vocoder not used: {e}; using the torch vocoder"
        log.warning(reason)
        return SelectedVocoder(torch_vocoder, "torch", reason)

    quantize = getattr(getattr(candidate, "info", None), "quantize", "none")
    limit = tolerance if tolerance is not None else DEFAULT_TOLERANCE.get(quantize, DEFAULT_TOLERANCE["none"])
    probe = probe_inputs(channels, gin_channels)
    try:
        with torch.inference_mode():
            reference = _on_its_device(torch_vocoder)(*probe)
            got = candidate(*probe)
        err = relative_error(got, reference)
    except Exception as e:  # a package that loads but cannot predict (Core ML runtime errors vary)
        reason = f"Core ML vocoder not used: its test prediction failed ({type(e).__name__}: {e}); using the torch vocoder"
        log.warning(reason)
        return SelectedVocoder(torch_vocoder, "torch", reason)
    if not err <= limit:
        reason = (f"Core ML vocoder not used: it differs from the torch vocoder by {err:.3g} of full scale on a "
                  f"test input (limit {limit:g}); using the torch vocoder")
        log.warning(reason)
        return SelectedVocoder(torch_vocoder, "torch", reason, err)
    log.info("using the Core ML vocoder %s (relative difference %.3g on a test input)", package, err)
    return SelectedVocoder(candidate, "coreml", "", err)


def use_coreml_decoder(sovits: torch.nn.Module, package: str, sample_rate: int, **select: object) -> SelectedVocoder:
    """Run the HiFi-GAN decoder of a v1/v2/v2Pro* SoVITS model as a Core ML package (``vocoder_backend: coreml``).

    The package must be the export of this model's own decoder (``export-coreml --vocoder v2``): after the
    identity check, the probe comparison with the torch decoder catches a package made from other weights.
    When it fits, ``sovits.dec`` becomes a :class:`~engine.coreml.package.CoreMLDecoder` (at load time, before
    the model is shared); otherwise the torch decoder stays and the reason is logged. ``select`` passes
    ``system``/``coremltools_ok``/``load_package`` to :func:`select_vocoder` (tests fake them).
    """
    import math

    dims = sovits.dims
    chosen = select_vocoder("coreml", _on_its_device(sovits.dec), kind="v2", sample_rate=sample_rate,
                            hop=math.prod(dims.upsample_rates), channels=dims.inter_channels,
                            gin_channels=dims.gin_channels, package=package or None, **select)  # type: ignore[arg-type]
    if chosen.backend == "coreml":
        from engine.coreml.package import CoreMLDecoder

        sovits.dec = CoreMLDecoder(chosen.vocoder)
    return chosen
