"""The one place that decides device and precision, and runs what a device lacks on the CPU.

``resolve_runtime`` looks at the machine once (through a :class:`DeviceProbe` that tests fake) and
returns a frozen :class:`Runtime`. Loaders apply it once (``module.to(rt.device, rt.dtype_for(stage))``);
everything else asks tensors and modules for their device and dtype. ``runtime_for_config`` maps a
``tts_infer.yaml`` section (``device``, ``is_half`` and the optional ``precision`` key) onto it: a section without
a device (or ``device: auto``) gets the best one here (cuda, then mps, then cpu) and, without ``is_half``, the
precision that suits it; a device the section names stays its choice.

:class:`DeviceFallback` reruns a whole stage on the CPU when the accelerator lacks one of its
operators (MPS), remembers the stage and counts it; :class:`CpuFallback` does the same for a
weight-free function. docs/apple-silicon.md lists the operators GPT-SoVITS has hit.

:func:`wait_for_device` and :func:`copy_to_host` are the one way device results reach the host: a copy to
the CPU with ``non_blocking=True`` is only queued, on MPS as on CUDA, so the host waits before reading.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import math
import os
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

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
    # stage -> why it runs in its precision (resolve_runtime's decision, in words for /health and `doctor`)
    reasons: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), compare=False)

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

    def reason_for(self, stage: str) -> str:
        return self.reasons.get(stage, "")

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


CPU_FP32 = "fp32: half precision is slow or missing on the CPU (the official code runs fp32 there too)"
MPS_VOCODER_FP32 = ("fp32 (auto): the vocoders' sin/exp and long upsampling chains lose audible accuracy in fp16 "
                    "on Apple GPUs")


def _auto_dtypes(device: torch.device, probe: DeviceProbe) -> tuple[dict[str, torch.dtype], dict[str, str]]:
    """The default precision per stage, and the reason for each choice."""
    fp32 = {s: torch.float32 for s in STAGES}
    if device.type == "cpu":
        return fp32, {s: CPU_FP32 for s in STAGES}
    if device.type == "cuda":
        cap = probe.cuda_capability or (0, 0)
        gtx16 = cap == (7, 5) and "16" in probe.cuda_name and "GTX" in probe.cuda_name.upper()
        if cap <= (6, 1) or gtx16:  # the official config.py makes the same call
            return fp32, {s: f"fp32 (auto): fp16 is slow on {probe.cuda_name or 'this GPU'}" for s in STAGES}
        return ({s: torch.float16 for s in STAGES},
                {s: "fp16 (auto): the official CUDA default (is_half: true)" for s in STAGES})
    # MPS: fp16 kernels are fast; the vocoders stay fp32
    return ({s: (torch.float32 if s == "vocoder" else torch.float16) for s in STAGES},
            {s: MPS_VOCODER_FP32 if s == "vocoder" else "fp16 (auto): fast on the Apple GPU" for s in STAGES})


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
        dtypes, reasons = _auto_dtypes(dev, probe)
    elif prec in PRECISIONS:
        dtypes = {s: PRECISIONS[prec] for s in STAGES}
        reasons = {s: f"{prec}: asked for (--precision or the config)" for s in STAGES}
    else:
        raise ConfigError(f"precision {precision!r} is not one of auto, {', '.join(PRECISIONS)}")
    for stage, name in (stage_overrides or {}).items():
        if stage not in STAGES:
            raise ConfigError(f"precision override for unknown stage {stage!r}; stages: {', '.join(STAGES)}")
        if name not in PRECISIONS:
            raise ConfigError(f"precision {name!r} for stage {stage!r} is not one of {', '.join(PRECISIONS)}")
        dtypes[stage] = PRECISIONS[name]
        reasons[stage] = f"{name}: the config's precision for this stage"
    if dev.type == "cpu" and any(d != torch.float32 for d in dtypes.values()):
        log.info("half precision is not used on the CPU; running every stage in fp32")
        dtypes = {s: torch.float32 for s in STAGES}
        reasons = {s: CPU_FP32 + " (half precision was asked for)" for s in STAGES}
    if dev.type == "cuda" and torch.bfloat16 in dtypes.values() and not probe.cuda_bf16:
        raise ConfigError(f"bf16 was requested but {probe.cuda_name or 'this GPU'} does not support it; use fp16")
    return Runtime(device=dev, stage_dtypes=MappingProxyType(dtypes), reasons=MappingProxyType(reasons))


def runtime_from_official(device: str, is_half: bool, probe: DeviceProbe | None = None) -> Runtime:
    """The runtime a ``tts_infer.yaml`` section asks for (``device`` string + ``is_half``).

    Unlike the official code, a CUDA device that is not there is an error, not a silent CPU run.
    """
    return resolve_runtime(device, "fp16" if is_half else "fp32", probe=probe)


def section_precision(is_half: bool | None, device: torch.device) -> str:
    """What a section's ``is_half`` means on ``device``: None (not set) the ``auto`` policy of the device; fp32
    when false; when true fp16, except on MPS, where it means the ``auto`` policy (fp16 with the vocoders kept in
    fp32)."""
    if is_half is None:
        return "auto"
    if not is_half:
        return "fp32"
    return "auto" if device.type == "mps" else "fp16"


def runtime_for_config(device: str | None, is_half: bool | None, override_device: str | None = None,
                       override_precision: str | None = None, probe: DeviceProbe | None = None,
                       precision: str | None = None,
                       stage_precisions: Mapping[str, str] | None = None) -> tuple[Runtime, str]:
    """The runtime of a config section with command-line overrides, and a notice ("" if none).

    Device: a device named on the command line must exist. ``auto``, "" or None (a section without a
    ``device``, as the shipped configs/tts_infer.yaml) picks cuda, then mps, then cpu, with no notice. A device
    named only by the config that this machine lacks (the official tts_infer.yaml asks for CUDA) falls back to
    ``auto``, and the notice says so, so a server or page still starts on a machine without that device.

    Precision, first match wins: the command line (``override_precision``), the section's
    ``precision`` key, then ``is_half`` (see :func:`section_precision`; None: ``auto``). The section's per-stage keys
    (``stage_precisions``, e.g. ``{"vocoder": "fp32"}``) then set single stages.
    """
    probe = probe_devices() if probe is None else probe
    notice = ""
    try:
        dev = resolve_device(override_device or device, probe)
    except DeviceUnavailableError as e:
        if override_device:
            raise
        notice = (f"the config asks for device {device!r}, which this machine lacks ({e}); "
                  "running on the best device available instead (choose one with --device)")
        log.info(notice)  # the caller shows the returned notice (the CLI prints it, the page shows it)
        dev = resolve_device("auto", probe)
    chosen = override_precision or precision or section_precision(is_half, dev)
    return resolve_runtime(str(dev), chosen, stage_precisions, probe=probe), notice


# ---- reading device results on the host --------------------------------------------------------


def wait_for_device(device: torch.device | str, all_streams: bool = False) -> None:
    """Block until the work queued on ``device`` is done: on CUDA the current stream (every stream with
    ``all_streams``), on MPS and any other accelerator its queue (``torch.<type>.synchronize``); nothing on
    the CPU. Call it between a non-blocking copy to the host and the first read of the copy."""
    device = torch.device(device)
    if device.type == "cpu":
        return
    if device.type == "cuda":
        if all_streams:
            torch.cuda.synchronize(device)
        else:
            torch.cuda.current_stream(device).synchronize()
        return
    backend = getattr(torch, device.type, None)
    sync = getattr(backend, "synchronize", None)
    if sync is None:
        raise DeviceUnavailableError(f"cannot wait for device {device}: torch.{device.type}.synchronize is missing")
    sync()  # MPS has one queue per process; torch.mps.synchronize takes no device


def copy_to_host(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], device: torch.device | str) -> None:
    """``dst.copy_(src)`` for every (host dst, src on ``device``) pair, queued without blocking, then one wait for
    ``device``: when it returns, the host tensors hold the results and can be read."""
    device = torch.device(device)
    for dst, src in pairs:
        dst.copy_(src, non_blocking=device.type != "cpu")
    wait_for_device(device)


def host_to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array on ``device``: on CUDA through pinned memory without waiting for the stream (a copy from
    pageable memory first waits for the work queued before it, e.g. the previous round's kernels)."""
    t = torch.from_numpy(array)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


class HostCopy:
    """Tensors on ``device`` on their way to the host, in one copy per dtype (concatenated flat on the device),
    queued without waiting: on CUDA into pinned buffers behind an event, so the caller can queue more device
    work (the next round) before :meth:`wait` reads the copies. Elsewhere :meth:`wait` waits for the device as
    :func:`copy_to_host` does. Same values and shapes."""

    def __init__(self, tensors: Sequence[torch.Tensor], device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._shapes = [t.shape for t in tensors]
        self._parts: list[tuple[list[int], torch.Tensor]] = []
        self._event = None
        if not tensors or self.device.type == "cpu":
            self._ready = list(tensors)
            return
        self._ready = None
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i, t in enumerate(tensors):
            by_dtype.setdefault(t.dtype, []).append(i)
        cuda = self.device.type == "cuda"
        for dtype, idx in by_dtype.items():
            flat = torch.cat([tensors[i].reshape(-1) for i in idx])
            host = torch.empty(flat.shape, dtype=dtype, pin_memory=cuda and torch.cuda.is_available())  # pinned:
            host.copy_(flat, non_blocking=True)  # the copy is only queued
            self._parts.append((idx, host))
        if cuda:
            self._event = torch.cuda.Event()
            self._event.record(torch.cuda.current_stream(self.device))

    def wait(self) -> list[torch.Tensor]:
        """The tensors on the host (blocks until their copy is done)."""
        if self._ready is not None:
            return self._ready
        if self._event is not None:
            self._event.synchronize()
        else:
            wait_for_device(self.device)
        out: list = [None] * len(self._shapes)
        for idx, host in self._parts:
            if host.is_pinned():  # out of the pinned pool at once: what callers keep must not hold it
                host = torch.empty(host.shape, dtype=host.dtype).copy_(host)
            for i, piece in zip(idx, torch.split(host, [math.prod(self._shapes[i]) for i in idx])):
                out[i] = piece.view(self._shapes[i])
        self._ready, self._parts = out, []
        return out


def tensors_to_host(tensors: Sequence[torch.Tensor], device: torch.device | str) -> list[torch.Tensor]:
    """Tensors on ``device`` on the host in one copy (one wait for the device, not one a tensor): concatenated
    flat on the device per dtype, copied, split on the host (:class:`HostCopy`). Same values and shapes."""
    return HostCopy(tensors, device).wait()


# ---- operators the device lacks --------------------------------------------------------------

T = TypeVar("T")

# Phrases of the errors PyTorch raises for work a device cannot run. NotImplementedError is always
# one (unregistered operators, and MPS's "Output channels > 65536 not supported at the MPS device");
# RuntimeError/TypeError only with these phrases, and never an out-of-memory error.
_MISSING_PHRASES = ("not implemented for", "not currently implemented", "is not supported on mps",
                    "not supported at the mps device", "not supported on the mps", "for mps does not support",
                    "to the mps backend but it does not have support", "mpsgraph does not support")


CONV_BACKENDS = ("auto", "cudnn", "native")


def attention_without_shape_plans(device: torch.device) -> bool:
    """On CUDA, take cuDNN's attention out of ``scaled_dot_product_attention``'s choices (process-wide, as PyTorch
    keeps them; idempotent): returns whether it was on.

    Why: torch 2.11 on sm90/sm100 (H100, H200, B200) tries cuDNN's attention first, and cuDNN builds an execution
    plan for every new shape (hundreds of ms on a B200: modelscope/FunASR#3704). Nearly every call of ours has a
    shape of its own: a T2S prefill (rows x the widest prefix), HuBERT on each clip, BERT on each sentence. On an
    H200 a prefill took 67-120 ms, 117 ms for 1.15 rows at one client (docs/benchmarks.md, issue 31), while a
    24-layer decode step took 1 ms; that cuDNN's plans are the cause is not yet measured
    (benchmarks/prefill_shapes.py). The efficient and flash kernels need no plan; PyTorch picks among them as
    before. ``SOVITS_CUDNN_ATTENTION=1`` leaves cuDNN's attention on."""
    if device.type != "cuda" or os.environ.get("SOVITS_CUDNN_ATTENTION") == "1":
        return False
    was = torch.backends.cuda.cudnn_sdp_enabled()
    if was:
        torch.backends.cuda.enable_cudnn_sdp(False)
        log.info("cuDNN attention is off for scaled_dot_product_attention: it builds a plan per shape, and "
                 "prefills, clips and sentences each have one (SOVITS_CUDNN_ATTENTION=1 keeps it)")
    return was


def conv_backend(device: torch.device, choice: str = "auto"):
    """The convolution backend of the acoustic stages and reference preparation, as a context manager
    (thread-local in PyTorch): "auto" and "cudnn" leave PyTorch's choice (cuDNN on CUDA); "native" turns
    cuDNN off for the section, so PyTorch's own im2col + cuBLAS convolutions run.

    Measured on an H200 (benchmarks/acoustic_shapes.py, docs/benchmarks.md): every streaming chunk, sentence
    and clip has a new length, and cuDNN builds an execution plan for each new shape (about 55 ms of a 100 ms
    chunk decode at batch 1); "native" needs no plan and is a little faster at batch 1, but 5-16x slower for
    batched chunks, so "auto" keeps cuDNN."""
    if choice not in CONV_BACKENDS:
        raise ValueError(f"conv backend must be one of {', '.join(CONV_BACKENDS)}, got {choice!r}")
    if device.type == "cuda" and choice == "native":
        return torch.backends.cudnn.flags(enabled=False)
    return contextlib.nullcontext()


def is_missing_operator(err: BaseException) -> bool:
    """True for the errors of an operator (or a size or dtype of one) the device cannot run."""
    if isinstance(err, NotImplementedError):
        return True
    if not isinstance(err, (RuntimeError, TypeError)):
        return False
    text = str(err).lower()
    return "out of memory" not in text and any(p in text for p in _MISSING_PHRASES)


_is_missing_operator = is_missing_operator  # the former private name


def _map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``obj`` with ``fn`` applied to every tensor inside tuples, lists, dicts and dataclasses."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple
        return type(obj)(*(_map_tensors(o, fn) for o in obj))
    if isinstance(obj, tuple):
        return tuple(_map_tensors(o, fn) for o in obj)
    if isinstance(obj, list):
        return [_map_tensors(o, fn) for o in obj]
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: _map_tensors(getattr(obj, f.name), fn) for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **changes)
    return obj


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    _map_tensors((args, kwargs), lambda t: found.append(t) or t)
    return found


class CpuFallback:
    """Runs a parameter-free operator on the CPU when the tensors' device lacks it; logs once per operator.

    For functions without weights (a spectrogram, an interpolation). Networks go through
    :class:`DeviceFallback`, which also moves their weights. One instance per engine owns the set of
    operators already reported (bounded by the number of distinct names the engine wraps).
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
        except (NotImplementedError, RuntimeError, TypeError) as err:
            if not is_missing_operator(err):
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


@dataclass(frozen=True)
class FallbackRecord:
    """Why a stage runs on the CPU: the device that failed and the first line of its error."""

    stage: str
    device: str
    error: str


def _weights_of(module: Any) -> list[torch.Tensor]:
    if isinstance(module, (tuple, list)):
        return [w for m in module for w in _weights_of(m)]
    net = module if isinstance(module, nn.Module) else getattr(module, "model", None)
    if not isinstance(net, nn.Module):
        return []
    return [*net.parameters(), *net.buffers()]


def _first_weight(module: Any) -> torch.Tensor | None:
    if isinstance(module, (tuple, list)):
        return next((w for m in module if (w := _first_weight(m)) is not None), None)
    net = module if isinstance(module, nn.Module) else getattr(module, "model", None)
    if not isinstance(net, nn.Module):
        return None
    first = next(iter(net.parameters()), None)
    return first if first is not None else next(iter(net.buffers()), None)


def _module_device(module: Any) -> torch.device | None:
    first = _first_weight(module)  # called on every stage run: no walk over all the weights
    return first.device if first is not None else None


def _module_dtype(module: Any) -> torch.dtype:
    floats = [w.dtype for w in _weights_of(module) if w.is_floating_point()]
    return floats[0] if floats else torch.float32


def cpu_copy(module: Any) -> Any:
    """A float32 copy of ``module`` on the CPU, built without a second copy on the device."""
    memo: dict[int, Any] = {}
    for t in _weights_of(module):
        moved = t.detach().to("cpu", torch.float32 if t.is_floating_point() else t.dtype)
        memo[id(t)] = nn.Parameter(moved, requires_grad=False) if isinstance(t, nn.Parameter) else moved
    return copy.deepcopy(module, memo)


class DeviceFallback:
    """Reruns a whole stage on the CPU when the accelerator lacks one of its operators (MPS).

    ``run(stage, module, fn, *args)`` calls ``fn(module, *args)``. If that raises a missing-operator
    error (NotImplementedError, or PyTorch's MPS "not implemented"/"not supported" errors) on a device
    listed in ``devices``, the stage is remembered, logged once and counted, and ``fn`` runs again
    on a float32 CPU copy of ``module`` with the inputs moved to the CPU; the outputs come back to the
    device in the stage's dtype. Later calls of that stage go straight to the CPU path.

    One instance per engine. It owns the CPU copies (one per network, dropped with the network) and
    the per-stage counts that ``/metrics`` exports (:meth:`counts`).
    """

    def __init__(self, devices: tuple[str, ...] = ("mps",), logger: logging.Logger = log) -> None:
        self.devices = devices
        self._logger = logger
        self._lock = threading.Lock()
        self._records: dict[str, FallbackRecord] = {}
        self._counts: dict[str, int] = {}
        self._copies: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    @property
    def cpu_stages(self) -> dict[str, FallbackRecord]:
        """The stages that run on the CPU now, with the error that sent them there."""
        with self._lock:
            return dict(self._records)

    def counts(self) -> dict[str, int]:
        """CPU runs per stage since start (the first, failed device attempt included)."""
        with self._lock:
            return dict(self._counts)

    def run(self, stage: str, module: Any, fn: Callable[..., T], *args: Any, out_dtype: torch.dtype | None = None,
            **kwargs: Any) -> T:
        """``fn(module, *args, **kwargs)``, on the CPU when ``stage`` needs it. ``module``: a network, or a tuple
        of networks (None allowed) that ``fn`` receives as one. ``out_dtype``: the dtype of floating outputs of
        a CPU run (default: the stage's, i.e. its first network's); float32 suits audio."""
        device = _module_device(module)
        if device is None or device.type not in self.devices:
            return fn(module, *args, **kwargs)
        if stage not in self._records:
            try:
                return fn(module, *args, **kwargs)
            except (NotImplementedError, RuntimeError, TypeError) as err:
                if not is_missing_operator(err):
                    raise
                self._remember(stage, device, err)
        return self._on_cpu(stage, module, fn, device, args, kwargs, out_dtype)

    def moves_to_cpu(self, stage: str, device: torch.device, err: BaseException) -> bool:
        """For a stage that keeps state on the device (the scheduler's slot pool): True when ``err`` on ``device``
        means the stage must move to the CPU. Then the stage is remembered, logged once and counted, and the
        caller moves its state (weights through :meth:`cpu_model`) and runs the step again."""
        if device.type not in self.devices or not is_missing_operator(err):
            return False
        self._remember(stage, device, err)
        self.count(stage)
        return True

    def count(self, stage: str) -> None:
        """One more run of ``stage`` on the CPU (a moved stateful stage counts each of its steps)."""
        with self._lock:
            self._counts[stage] = self._counts.get(stage, 0) + 1

    def cpu_model(self, module: Any) -> Any:
        """The float32 CPU copy of ``module`` this fallback owns (made once, dropped with the module)."""
        return self._cpu_module(module)

    def _remember(self, stage: str, device: torch.device, err: BaseException) -> None:
        line = (str(err).splitlines() or [type(err).__name__])[0]
        with self._lock:
            first = stage not in self._records
            self._records.setdefault(stage, FallbackRecord(stage, str(device), line))
        if first:
            self._logger.warning("the %s stage needs an operator %s lacks; it runs on the CPU from now on (%s: %s)",
                                 stage, device, type(err).__name__, line)

    def _cpu_module(self, module: Any) -> Any:
        if isinstance(module, (tuple, list)):
            return type(module)(None if m is None else self._cpu_module(m) for m in module)
        with self._lock:
            found = self._copies.get(module)
        if found is None:
            found = cpu_copy(module)
            with self._lock:
                self._copies[module] = found
        return found

    def _on_cpu(self, stage: str, module: Any, fn: Callable[..., T], device: torch.device,
                args: tuple, kwargs: dict, out_dtype: torch.dtype | None) -> T:
        self.count(stage)
        dtype = out_dtype or _module_dtype(module)
        cpu_args = _map_tensors(args, _to_cpu_float)
        cpu_kwargs = {k: _cpu_generator(v) if isinstance(v, torch.Generator) else _map_tensors(v, _to_cpu_float)
                      for k, v in kwargs.items()}
        cpu_args = tuple(_cpu_generator(a) if isinstance(a, torch.Generator) else a for a in cpu_args)
        out = fn(self._cpu_module(module), *cpu_args, **cpu_kwargs)
        return _map_tensors(out, lambda t: t.to(device, dtype) if t.is_floating_point() else t.to(device))


def _to_cpu_float(t: torch.Tensor) -> torch.Tensor:
    return t.to("cpu", torch.float32) if t.is_floating_point() else t.cpu()


def _cpu_generator(gen: torch.Generator) -> torch.Generator:
    """A CPU generator seeded from ``gen`` (which advances), so a request's noise stays reproducible."""
    if gen.device.type == "cpu":
        return gen
    seed = int(torch.randint(0, 2**62, (1,), generator=gen, device=gen.device).item())
    return torch.Generator().manual_seed(seed)
