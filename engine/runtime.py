"""The one place that decides device and precision, and runs operators a device lacks on the CPU.

``resolve_runtime`` looks at the machine once (through a :class:`DeviceProbe` that tests fake) and
returns a frozen :class:`Runtime`. Loaders apply it once (``module.to(rt.device, rt.dtype_for(stage))``);
everything else asks tensors and modules for their device and dtype.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

import torch

from engine.errors import ConfigError, DeviceUnavailableError

log = logging.getLogger(__name__)

# Networks that get their own precision. Sampling (softmax, top-k/p, penalties) is always fp32.
STAGES = ("t2s", "sovits", "vocoder", "ssl", "bert", "sv")
PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
SAMPLING_DTYPE = torch.float32


@dataclass(frozen=True)
class DeviceProbe:
    """What the machine offers. Built by :func:`probe_devices`; tests build it by hand."""

    cuda_count: int = 0
    cuda_capability: tuple[int, int] | None = None  # of cuda:0
    cuda_name: str = ""
    cuda_bf16: bool = False
    mps: bool = False


def probe_devices() -> DeviceProbe:
    """Ask torch what this machine has (cheap; call once per engine, not at import)."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    if count == 0:
        return DeviceProbe(mps=mps)
    return DeviceProbe(
        cuda_count=count,
        cuda_capability=torch.cuda.get_device_capability(0),
        cuda_name=torch.cuda.get_device_name(0),
        cuda_bf16=torch.cuda.is_bf16_supported(),
        mps=mps,
    )


@dataclass(frozen=True)
class Runtime:
    """Device and per-stage precision of one engine instance."""

    device: torch.device
    stage_dtypes: Mapping[str, torch.dtype] = field(
        default_factory=lambda: MappingProxyType({s: torch.float32 for s in STAGES})
    )

    def dtype_for(self, stage: str) -> torch.dtype:
        if stage not in self.stage_dtypes:
            raise KeyError(f"unknown stage {stage!r}; known: {', '.join(STAGES)}")
        return self.stage_dtypes[stage]

    @property
    def sampling_dtype(self) -> torch.dtype:
        return SAMPLING_DTYPE

    @property
    def is_half(self) -> bool:
        """True when any network runs below fp32 (the official ``is_half`` flag)."""
        return any(d != torch.float32 for d in self.stage_dtypes.values())

    def describe(self) -> str:
        names = {v: k for k, v in PRECISIONS.items()}
        return f"{self.device} " + " ".join(f"{s}={names[d]}" for s, d in self.stage_dtypes.items())


def resolve_device(requested: str | None, probe: DeviceProbe) -> torch.device:
    """``auto``/None: cuda, then mps, then cpu. An explicit device that is not there is an error."""
    req = (requested or "auto").strip().lower()
    if req == "auto":
        if probe.cuda_count:
            return torch.device("cuda", 0)
        return torch.device("mps") if probe.mps else torch.device("cpu")
    try:
        dev = torch.device(req)
    except RuntimeError as e:
        raise ConfigError(f"device {requested!r} is not a device name; use auto, cpu, cuda, cuda:N or mps") from e
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        index = 0 if dev.index is None else dev.index
        if probe.cuda_count == 0:
            raise DeviceUnavailableError(
                f"device {requested!r} was requested but CUDA is not available here "
                "(no NVIDIA GPU or a CPU-only torch build); use device: auto or cpu"
            )
        if index >= probe.cuda_count:
            raise DeviceUnavailableError(
                f"device {requested!r} was requested but only {probe.cuda_count} CUDA device(s) exist "
                f"(cuda:0..cuda:{probe.cuda_count - 1})"
            )
        return torch.device("cuda", index)
    if dev.type == "mps":
        if not probe.mps:
            raise DeviceUnavailableError(
                f"device {requested!r} was requested but MPS (Apple GPU) is not available here; use auto or cpu"
            )
        return dev
    raise DeviceUnavailableError(f"device {requested!r} is not supported; use auto, cpu, cuda, cuda:N or mps")


def _auto_dtypes(device: torch.device, probe: DeviceProbe) -> dict[str, torch.dtype]:
    """The default precision per stage, with the reason for each choice in the comments."""
    fp32 = {s: torch.float32 for s in STAGES}
    if device.type == "cpu":
        return fp32  # half matmuls are slow or missing on CPU; the official code forces fp32 there too
    if device.type == "cuda":
        cap = probe.cuda_capability or (0, 0)
        gtx16 = cap == (7, 5) and "16" in probe.cuda_name and "GTX" in probe.cuda_name.upper()
        if cap <= (6, 1) or gtx16:
            return fp32  # slow fp16 on these cards (the official config.py makes the same call)
        return {s: torch.float16 for s in STAGES}  # the official CUDA default (is_half: true)
    # MPS: fp16 kernels are fast; keep the vocoders in fp32 (sin/exp in snake activations and the
    # long upsampling chains lose audible accuracy in fp16 on Apple GPUs).
    return {s: (torch.float32 if s == "vocoder" else torch.float16) for s in STAGES}


def resolve_runtime(
    device: str | None = "auto",
    precision: str | None = "auto",
    stage_overrides: Mapping[str, str] | None = None,
    probe: DeviceProbe | None = None,
) -> Runtime:
    """Decide device and per-stage precision once.

    precision: ``auto`` (per-device defaults), ``fp32``, ``fp16`` or ``bf16`` for every stage;
    ``stage_overrides`` then sets single stages, e.g. ``{"vocoder": "fp32"}``. Half precision on
    the CPU is refused with a logged note (fp32 is used), as the official code does.
    """
    probe = probe_devices() if probe is None else probe
    dev = resolve_device(device, probe)
    prec = (precision or "auto").lower()
    if prec == "auto":
        dtypes = _auto_dtypes(dev, probe)
    elif prec in PRECISIONS:
        dtypes = {s: PRECISIONS[prec] for s in STAGES}
    else:
        raise ConfigError(f"precision {precision!r} is not one of auto, {', '.join(PRECISIONS)}")
    for stage, name in (stage_overrides or {}).items():
        if stage not in STAGES:
            raise ConfigError(f"precision override for unknown stage {stage!r}; stages: {', '.join(STAGES)}")
        if name not in PRECISIONS:
            raise ConfigError(f"precision {name!r} for stage {stage!r} is not one of {', '.join(PRECISIONS)}")
        dtypes[stage] = PRECISIONS[name]
    if dev.type == "cpu" and any(d != torch.float32 for d in dtypes.values()):
        log.info("half precision is not used on the CPU; running every stage in fp32")
        dtypes = {s: torch.float32 for s in STAGES}
    if dev.type == "cuda" and torch.bfloat16 in dtypes.values() and not probe.cuda_bf16:
        raise ConfigError(f"bf16 was requested but {probe.cuda_name or 'this GPU'} does not support it; use fp16")
    return Runtime(device=dev, stage_dtypes=MappingProxyType(dtypes))


def runtime_from_official(device: str, is_half: bool, probe: DeviceProbe | None = None) -> Runtime:
    """The runtime a ``tts_infer.yaml`` section asks for (``device`` string + ``is_half``).

    Unlike the official code, a CUDA device that is not there is an error, not a silent CPU run.
    """
    return resolve_runtime(device, "fp16" if is_half else "fp32", probe=probe)


def runtime_for_config(device: str, is_half: bool, override_device: str | None = None,
                       override_precision: str | None = None,
                       probe: DeviceProbe | None = None) -> tuple[Runtime, str]:
    """The runtime of a config section with command-line overrides, and a notice ("" if none).

    A device named on the command line must exist. A device named only by the config that this
    machine lacks (the shipped official config asks for CUDA) falls back to ``auto``, and the notice
    says so, so a server or page still starts on a machine without that device.
    """
    precision = override_precision or ("fp16" if is_half else "fp32")
    try:
        return resolve_runtime(override_device or device, precision, probe=probe), ""
    except DeviceUnavailableError as e:
        if override_device:
            raise
        notice = (f"the config asks for device {device!r}, which this machine lacks ({e}); "
                  "running on the best device available instead (choose one with --device)")
        log.warning(notice)
        return resolve_runtime("auto", override_precision or "auto", probe=probe), notice


T = TypeVar("T")


def _is_missing_operator(err: BaseException) -> bool:
    text = str(err)
    return isinstance(err, NotImplementedError) or (
        isinstance(err, RuntimeError) and ("not implemented for" in text or "not currently implemented" in text)
    )


def _map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(_map_tensors(o, fn) for o in obj)
    if isinstance(obj, list):
        return [_map_tensors(o, fn) for o in obj]
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    return obj


class CpuFallback:
    """Runs an operator on the CPU when the tensors' device lacks it; logs once per operator.

    One instance per engine owns the set of operators already reported (bounded by the number of
    distinct operator names the engine wraps).
    """

    def __init__(self, logger: logging.Logger = log) -> None:
        self._logger = logger
        self._reported: set[str] = set()
        self._lock = threading.Lock()

    @property
    def fallen_back(self) -> frozenset[str]:
        return frozenset(self._reported)

    def run(self, name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except (NotImplementedError, RuntimeError) as err:
            if not _is_missing_operator(err):
                raise
            devices = {t.device for t in _tensors(args, kwargs)}
            if not devices or devices == {torch.device("cpu")}:
                raise
            with self._lock:
                first = name not in self._reported
                self._reported.add(name)
            if first:
                self._logger.warning("operator %s is missing on %s; running it on the CPU (%s)",
                                     name, ", ".join(sorted(map(str, devices))), str(err).splitlines()[0])
            back = next(iter(devices))
            out = fn(*_map_tensors(args, lambda t: t.cpu()), **_map_tensors(kwargs, lambda t: t.cpu()))
            return _map_tensors(out, lambda t: t.to(back))


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    _map_tensors((args, kwargs), lambda t: found.append(t) or t)
    return found
