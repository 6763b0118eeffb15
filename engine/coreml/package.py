"""What a SoVITS Studio Core ML vocoder package is, how to check one, and how to run one on macOS.

A package (``.mlpackage``, mlprogram) carries its identity in the model's user metadata
(``sovits_studio.*`` keys, written by :mod:`engine.coreml.export`):

* one float32 input ``mel`` (1, n_mels, T) (``z`` (1, 192, T) + ``ge`` (1, gin, 1) for the v2
  decoder) with a bounded flexible time axis ``min_frames <= T <= max_frames``;
* one float32 output ``audio`` (1, 1, T * hop);
* the vocoder kind, sample rate, hop, bounds, precision plan and weight quantisation.

:func:`read_package_info` reads that from the spec without compiling the model, so it works on
Linux. :class:`CoreMLVocoder` runs a package (macOS only) and cuts mels longer than the bound
into overlapping windows.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.errors import CheckpointError

META_PREFIX = "sovits_studio."
FORMAT_VERSION = "1"
KINDS = ("bigvgan", "v4", "v2")
WINDOW_CONTEXT = 48  # frames of context each side of a window when a mel exceeds the package bound


@dataclass(frozen=True)
class PackageInfo:
    path: Path
    kind: str  # "bigvgan" | "v4" | "v2"
    sample_rate: int
    hop: int  # audio samples per input frame
    channels: int  # mel bands (or latent channels for v2)
    min_frames: int
    max_frames: int
    input_names: tuple[str, ...]
    output_name: str
    quantize: str  # "none" | "int8"
    precision: str  # human-readable precision plan
    metadata: dict[str, str]


def _spec_path(path: Path) -> Path:
    return path / "Data" / "com.apple.CoreML" / "model.mlmodel"


def read_package_info(path: str | os.PathLike) -> PackageInfo:
    """Identity and interface of a package, from its spec (no compilation; works off macOS).

    Raises CheckpointError for a missing, corrupt or foreign package.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"Core ML package not found: {path}; export one with `sovits-studio export-coreml`")
    if not path.is_dir() or not (path / "Manifest.json").is_file():
        raise CheckpointError(f"{path} is not a Core ML .mlpackage folder (no Manifest.json)")
    try:
        json.loads((path / "Manifest.json").read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"Core ML package {path} is corrupt: unreadable Manifest.json ({e}); export it again") from e
    spec_file = _spec_path(path)
    if not spec_file.is_file():
        raise CheckpointError(f"Core ML package {path} is corrupt: it has no model spec; export it again")
    try:
        from engine.coreml import import_coremltools

        import_coremltools()
        from coremltools.proto import Model_pb2

        spec = Model_pb2.Model()
        spec.ParseFromString(spec_file.read_bytes())
    except ImportError as e:
        raise CheckpointError("reading Core ML packages needs coremltools: pip install coremltools") from e
    except Exception as e:  # protobuf raises DecodeError (and other internal errors) on damaged bytes
        raise CheckpointError(f"Core ML package {path} is corrupt: its model spec does not parse ({e}); export it again") from e
    if not spec.HasField("mlProgram"):
        raise CheckpointError(f"Core ML package {path} is not an ML program; export it with `sovits-studio export-coreml`")
    meta = dict(spec.description.metadata.userDefined)
    ours = {k[len(META_PREFIX) :]: v for k, v in meta.items() if k.startswith(META_PREFIX)}
    if "kind" not in ours:
        raise CheckpointError(
            f"Core ML package {path} was not exported by SoVITS Studio (no {META_PREFIX}kind metadata); "
            "export it with `sovits-studio export-coreml`"
        )
    try:
        return PackageInfo(
            path=path,
            kind=ours["kind"],
            sample_rate=int(ours["sample_rate"]),
            hop=int(ours["hop"]),
            channels=int(ours["channels"]),
            min_frames=int(ours["min_frames"]),
            max_frames=int(ours["max_frames"]),
            input_names=tuple(i.name for i in spec.description.input),
            output_name=spec.description.output[0].name,
            quantize=ours.get("quantize", "none"),
            precision=ours.get("precision", ""),
            metadata=ours,
        )
    except (KeyError, ValueError, IndexError) as e:
        raise CheckpointError(f"Core ML package {path} has incomplete SoVITS Studio metadata ({e}); export it again") from e


_DTYPE_NAMES = {10: "float16", 11: "float32", 12: "float64", 21: "int8"}  # MIL proto DataType values


def op_precisions(path: str | os.PathLike) -> dict[str, set[str]]:
    """op type -> output dtypes in a package's ML program (e.g. ``{"sin": {"float32"}}``); for inspection."""
    from engine.coreml import import_coremltools

    import_coremltools()
    from coremltools.proto import Model_pb2

    spec = Model_pb2.Model()
    spec.ParseFromString(_spec_path(Path(path)).read_bytes())
    out: dict[str, set[str]] = {}
    for fn in spec.mlProgram.functions.values():
        for block in fn.block_specializations.values():
            for op in block.operations:
                for o in op.outputs:
                    if o.type.HasField("tensorType"):
                        dt = o.type.tensorType.dataType
                        out.setdefault(op.type, set()).add(_DTYPE_NAMES.get(dt, str(dt)))
    return out


def check_package(info: PackageInfo, kind: str, sample_rate: int, hop: int, channels: int) -> None:
    """Raise CheckpointError unless the package is the vocoder the engine is about to use."""
    problems = []
    if info.kind != kind:
        problems.append(f"it was exported for the {info.kind!r} vocoder, but this model needs {kind!r}")
    if info.sample_rate != sample_rate:
        problems.append(f"it outputs {info.sample_rate} Hz, but this model needs {sample_rate} Hz")
    if info.hop != hop:
        problems.append(f"it makes {info.hop} samples per frame, but this vocoder makes {hop}")
    if info.channels != channels:
        problems.append(f"it takes {info.channels} input channels, but this vocoder takes {channels}")
    if problems:
        raise CheckpointError(
            f"Core ML package {info.path} does not fit: " + "; ".join(problems)
            + f". Export the right one with `sovits-studio export-coreml --vocoder {kind} ...`"
        )


def vocode_in_windows(
    fn: Callable[[torch.Tensor], torch.Tensor],
    mel: torch.Tensor,  # (1, C, T)
    max_frames: int,
    hop: int,
    context: int = WINDOW_CONTEXT,
    min_frames: int = 1,
) -> torch.Tensor:  # (1, 1, T * hop)
    """Run ``fn`` on windows of at most ``max_frames`` frames with ``context`` frames of overlap per side.

    Each window's outer context is discarded, so every output sample comes from a window in which
    it had at least ``context`` frames on both sides (or the true signal edge).
    """
    t = mel.shape[-1]
    if t <= max_frames:
        return fn(mel)
    step = max_frames - 2 * context
    if step < 1:
        raise ValueError(f"max_frames {max_frames} leaves no room for {context} frames of context per side")
    outs = []
    for start in range(0, t, step):
        stop = min(start + step, t)
        lo, hi = max(0, start - context), min(t, stop + context)
        if hi - lo < min_frames:  # a short tail: widen it to the left
            lo = max(0, hi - min_frames)
        audio = fn(mel[..., lo:hi])
        outs.append(audio[..., (start - lo) * hop : (stop - lo) * hop])
    return torch.cat(outs, dim=-1)


class CoreMLVocoder:
    """A Core ML vocoder package as a callable ``mel (1, C, T) -> audio (1, 1, T * hop)`` (macOS only)."""

    def __init__(self, info: PackageInfo, compute_units: str = "ALL"):
        try:
            from engine.coreml import import_coremltools

            ct = import_coremltools()
        except ImportError as e:
            raise CheckpointError("running Core ML packages needs coremltools: pip install coremltools") from e
        self.info = info
        units = getattr(ct.ComputeUnit, compute_units, None)
        if units is None:
            raise ValueError(f"compute_units must be one of ALL, CPU_ONLY, CPU_AND_GPU, CPU_AND_NE; got {compute_units!r}")
        try:
            self._model = ct.models.MLModel(str(info.path), compute_units=units)
        except Exception as e:  # Core ML reports compile/load failures with assorted exception types
            raise CheckpointError(f"Core ML could not load {info.path}: {e}") from e

    def _predict(self, mel: torch.Tensor, g: torch.Tensor | None) -> torch.Tensor:
        feed = {self.info.input_names[0]: mel.detach().float().cpu().numpy()}
        if len(self.info.input_names) > 1:  # the v2 decoder's style vector
            if g is None:
                raise ValueError(f"Core ML package {self.info.path} needs the style vector input {self.info.input_names[1]!r}")
            feed[self.info.input_names[1]] = g.detach().float().cpu().numpy()
        out = self._model.predict(feed)[self.info.output_name]
        return torch.from_numpy(out).float().reshape(1, 1, -1)

    def __call__(self, mel: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        if mel.shape[-1] < self.info.min_frames:
            pad = self.info.min_frames - mel.shape[-1]  # replicate the edge, then drop the extra audio
            audio = self._predict(torch.nn.functional.pad(mel, (0, pad), mode="replicate"), g)
            return audio[..., : mel.shape[-1] * self.info.hop].to(mel.device)
        audio = vocode_in_windows(lambda m: self._predict(m, g), mel, self.info.max_frames, self.info.hop,
                                  min_frames=self.info.min_frames)
        return audio.to(mel.device)


def load_coreml_vocoder(path: str | os.PathLike, kind: str, sample_rate: int, hop: int, channels: int,
                        compute_units: str = "ALL") -> CoreMLVocoder:
    """Check a package's identity, then load it for prediction (macOS)."""
    info = read_package_info(path)
    check_package(info, kind, sample_rate, hop, channels)
    return CoreMLVocoder(info, compute_units)


class CoreMLDecoder(torch.nn.Module):
    """A v1/v2/v2Pro* HiFi-GAN decoder package in place of ``SynthesizerTrn.dec`` (called as ``dec(z, g=ge)``).

    Holds no weights: inputs go to the package as float32 on the host, the audio comes back on the
    input's device in its dtype.
    """

    def __init__(self, vocoder: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.vocoder = vocoder

    def forward(self, x: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        audio = self.vocoder(x.float(), None if g is None else g.float())  # (1, 1, T * hop)
        return audio.to(device=x.device, dtype=x.dtype)
