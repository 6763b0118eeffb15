"""The memory watermark: when memory runs short, degrade step by step instead of crashing.

``MemoryGuard.admit(device)`` runs before each request. If the device is above the watermark it
runs the registered degrade steps in order, reading memory again after each, until the reading is
back under the watermark. The default order suits unified memory (Apple Silicon, where the GPU and
the CPU share one pool, and the CPU alone):

1. shrink the reference cache (``ORDER_REFERENCE_CACHE``),
2. evict idle models from the pool (``ORDER_IDLE_MODELS``),
3. close the idle schedulers, releasing their KV-cache pools (``ORDER_SLOTS``; the Studio registers
   this step; the next request makes a scheduler sized from the memory free then),
4. refuse the request with :class:`~engine.errors.MemoryPressureError` (HTTP 503, retry later).

Owners register their own steps with :meth:`MemoryGuard.add_step`. On a discrete GPU (CUDA) the
policy may instead run the request on the CPU (``on_memory_pressure: cpu``) or wait for memory;
on unified memory moving work to the CPU frees nothing (it would load a second copy of the
models), so there the last step is always to refuse. Steps that can be undone (``restore``) are
undone once memory falls well below the watermark. Every step is logged and counted
(:meth:`MemoryGuard.counts`, exported on ``/metrics``).

Readings come from :func:`read_memory` over injectable :class:`MemorySources`, so tests fake a Mac or a GPU:
on the CPU, this process's own resident memory against what it may have (its cgroup's limit, else the host's)
and its cgroup's working set against that limit (a shared machine's other tenants never count); on a Mac,
``torch.mps`` and the memory macOS will give; on CUDA, the device's memory. A refusal names the reading that
hit the watermark.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.errors import MemoryPressureError
from engine.options import EngineSettings

__all__ = ["MemoryPressureError", "MemoryReading", "MemorySources", "MpsMemory", "DegradeStep", "MemoryGuard",
           "Admission", "read_memory", "system_memory_reader", "memory_samples", "system_used"]

log = logging.getLogger(__name__)

ORDER_REFERENCE_CACHE = 10
ORDER_IDLE_MODELS = 20
ORDER_SLOTS = 30  # idle schedulers' KV-cache pools (engine.studio.Studio registers the step)
ORDER_OTHER = 50  # steps registered without an order
RESTORE_MARGIN = 0.10  # undo steps once the reading is this far below the watermark
UNIFIED = ("mps", "cpu")  # device types whose memory is the system's memory


@dataclass(frozen=True)
class MemoryReading:
    """Bytes in use and in total, and what was read ("process", "cgroup", "system", "mps", "cuda:0");
    ``of``: what the total is ("host memory", "cgroup limit"), where it is not plain."""

    used: int
    total: int
    source: str = ""
    of: str = ""

    @property
    def fraction(self) -> float:
        return self.used / self.total if self.total > 0 else 0.0

    def describe(self) -> str:
        """What was read, in words with its figures (for logs and the 503)."""
        used, total = _gib(self.used), _gib(self.total)
        if self.source == "process":
            return f"this server's own memory ({used} of {total} {self.of or 'host memory'})"
        if self.source == "cgroup":
            return f"its cgroup's working set ({used} of the {total} cgroup limit)"
        if self.source == "mps":
            return f"Metal's allocation ({used} of the {total} macOS recommends)"
        if self.source == "system":
            return f"system memory ({used} of {total})"
        return f"{self.source or 'device'} memory ({used} of {total})"


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


GIB = 1 << 30


@dataclass(frozen=True)
class MpsMemory:
    """The three ``torch.mps`` figures, in bytes."""

    current: int  # current_allocated_memory(): tensors alive
    driver: int  # driver_allocated_memory(): what Metal holds for this process (tensors + allocator cache)
    recommended_max: int  # recommended_max_memory(): the GPU working-set budget macOS recommends


def system_used(total: int, available: int, os_available: int | None) -> tuple[int, int]:
    """(used, total) of system memory as the OS will give it: ``total - available`` (psutil), or less where
    the OS itself says more is available (macOS: ``os_available``, see :func:`_macos_available`)."""
    given = max(available, os_available or 0)
    return max(0, total - min(total, given)), total


def _psutil_system() -> tuple[int, int] | None:
    """(used, total) bytes of system memory; used = total - what new allocations can get."""
    try:
        import psutil
    except ImportError:
        return None
    vm = psutil.virtual_memory()
    return system_used(int(vm.total), int(vm.available), _macos_available())


def _process_rss() -> int | None:
    """Bytes of this process's resident set (psutil); None when it cannot be read."""
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except (ImportError, OSError):
        return None


def _host_total() -> int | None:
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().total)


UNLIMITED_V1 = 1 << 62  # cgroup v1 writes "no limit" as a number near 2**63


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _inactive_file(stat: Path) -> int:
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        key, _, value = line.partition(" ")
        if key in ("inactive_file", "total_inactive_file") and value.strip().isdigit():
            return int(value)
    return 0


def cgroup_memory(root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc/self/cgroup")
                  ) -> tuple[int, int] | None:
    """(working set, limit) bytes of the nearest cgroup of this process that has a memory limit (v1 or v2);
    the working set is the usage less the inactive file cache (what the kernel cannot simply drop), as
    container runtimes count it. None without a limit, or where cgroups cannot be read."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None
    v1 = next((ln.split(":", 2)[2] for ln in lines if len(ln.split(":", 2)) == 3
               and "memory" in ln.split(":", 2)[1].split(",")), None)
    v2 = next((ln.split(":", 2)[2] for ln in lines if ln.startswith("0::")), None)
    if v1 is not None:
        base, rel, files = root / "memory", v1, ("memory.limit_in_bytes", "memory.usage_in_bytes")
    elif v2 is not None:
        base, rel, files = root, v2, ("memory.max", "memory.current")
    else:
        return None
    folder = base / rel.strip("/")
    while True:  # the own cgroup, then its parents (a namespaced mount shows only part of the path)
        limit = _read_int(folder / files[0])
        if limit is not None and limit < UNLIMITED_V1:
            usage = _read_int(folder / files[1])
            if usage is None:
                return None
            return max(0, usage - _inactive_file(folder / "memory.stat")), limit
        if folder == base or base not in folder.parents:
            return None
        folder = folder.parent


def _macos_available() -> int | None:
    """Bytes macOS says it will still give (``kern.memorystatus_level``: the percentage of memory available,
    the figure behind Activity Monitor's memory pressure; it counts the file cache and compressible pages
    that psutil's ``available``, free + inactive only, leaves out). None elsewhere or when it cannot be read."""
    import sys

    if sys.platform != "darwin":
        return None
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        level, size = ctypes.c_uint32(0), ctypes.c_size_t(4)
        if libc.sysctlbyname(b"kern.memorystatus_level", ctypes.byref(level), ctypes.byref(size), None, 0) != 0:
            return None
        total, size = ctypes.c_uint64(0), ctypes.c_size_t(8)
        if libc.sysctlbyname(b"hw.memsize", ctypes.byref(total), ctypes.byref(size), None, 0) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return int(total.value * min(100, level.value) / 100) if 0 < level.value else None


def _torch_mps() -> MpsMemory | None:
    import sys

    torch = sys.modules.get("torch")  # never import torch just to read memory
    if torch is None or not torch.backends.mps.is_available():
        return None
    mps = torch.mps
    try:
        return MpsMemory(int(mps.current_allocated_memory()), int(mps.driver_allocated_memory()),
                         int(mps.recommended_max_memory()))
    except (AttributeError, RuntimeError):
        return None


def _torch_cuda(index: int) -> tuple[int, int] | None:
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info(index)
    return int(total - free), int(total)


@dataclass(frozen=True)
class MemorySources:
    """Where readings come from. Tests replace any of them (e.g. a 16 GB Mac with 11 GB recommended)."""

    system: Callable[[], tuple[int, int] | None] = _psutil_system  # (used, total) of RAM, machine-wide (macOS)
    mps: Callable[[], MpsMemory | None] = _torch_mps
    cuda: Callable[[int], tuple[int, int] | None] = _torch_cuda  # device index -> (used, total)
    process: Callable[[], int | None] = _process_rss  # this process's resident bytes
    host_total: Callable[[], int | None] = _host_total  # the host's memory
    cgroup: Callable[[], tuple[int, int] | None] = cgroup_memory  # (working set, limit) of a limited cgroup


def _device_type(device: str) -> tuple[str, int]:
    kind, _, index = device.partition(":")
    return kind, int(index) if index.isdigit() else 0


def read_all(device: str, sources: MemorySources = MemorySources()) -> list[MemoryReading]:
    """Every reading that bounds work on ``device`` (unknown ones are left out)."""
    kind, index = _device_type(device)
    out: list[MemoryReading] = []
    if kind == "cuda":
        cuda = sources.cuda(index)
        if cuda is not None:
            out.append(MemoryReading(cuda[0], cuda[1], device))
        return out  # a discrete GPU: host memory is not what runs out first
    if kind == "mps":  # unified memory: Metal's budget, and the machine's memory as macOS will give it
        mps = sources.mps()
        if mps is not None and mps.recommended_max > 0:
            out.append(MemoryReading(mps.driver, mps.recommended_max, "mps"))
        system = sources.system()
        if system is not None and system[1] > 0:
            out.append(MemoryReading(system[0], system[1], "system"))
        return out
    # the CPU: this process's own memory against what it may have (its cgroup's limit, else the host's), and
    # its cgroup's working set against that limit; never the machine's other tenants (a shared box at 90%
    # refused every request of a server that used little)
    cgroup = sources.cgroup()
    host = sources.host_total()
    rss = sources.process()
    limited = cgroup is not None and (host is None or cgroup[1] < host)
    budget = cgroup[1] if limited else host  # type: ignore[index]
    if rss is not None and budget:
        out.append(MemoryReading(rss, budget, "process", "cgroup limit" if limited else "host memory"))
    if cgroup is not None and cgroup[1] > 0:
        out.append(MemoryReading(cgroup[0], cgroup[1], "cgroup"))
    return out


def read_memory(device: str, sources: MemorySources = MemorySources()) -> MemoryReading:
    """The tightest reading for ``device``: CUDA memory on a GPU; on a Mac the fuller of Metal's
    allocation (``driver_allocated_memory``) against its budget (``recommended_max_memory``) and system memory
    as the OS will give it (psutil, or macOS's own memory level when that leaves more); system memory on the CPU.
    ``MemoryReading(0, 0)`` when nothing can be read (then the guard never blocks)."""
    readings = read_all(device, sources)
    return max(readings, key=lambda r: r.fraction) if readings else MemoryReading(0, 0, "unknown")


def system_memory_reader(device: str) -> MemoryReading:
    """The real readings (the default ``reader`` of :class:`MemoryGuard`)."""
    return read_memory(device)


def memory_samples(device: str, sources: MemorySources = MemorySources()) -> list[tuple[dict[str, str], float]]:
    """Gauge samples ``({"source": ..., "kind": "used"|"total"}, bytes)`` for ``/metrics``."""
    out = []
    for r in read_all(device, sources):
        out.append(({"source": r.source, "kind": "used"}, float(r.used)))
        out.append(({"source": r.source, "kind": "total"}, float(r.total)))
    return out


MemoryReader = Callable[[str], MemoryReading]  # device string ("cpu", "cuda:0", "mps") -> reading
Shrinker = Callable[[], int]  # frees what it can, returns bytes released (best effort)


@dataclass(frozen=True)
class DegradeStep:
    """One way to free memory. ``run`` does it and returns the bytes released (0 if unknown)."""

    name: str  # as logged and counted, e.g. "reference cache"
    run: Callable[[], int | None]
    order: int = ORDER_OTHER  # lower runs first
    devices: tuple[str, ...] = ()  # device types it applies to ("cuda", "mps", "cpu"); empty: all
    restore: Callable[[], None] | None = None  # undo once memory is back well under the watermark

    def applies_to(self, device: str) -> bool:
        return not self.devices or _device_type(device)[0] in self.devices


@dataclass(frozen=True)
class Admission:
    """Where a request may run, and why."""

    device: str  # the device to run on (the requested one, or "cpu" when degraded on a discrete GPU)
    action: str  # "ok", "shrunk" (degrade steps ran, then it fit), "cpu", "waited"
    reading: MemoryReading
    steps: tuple[str, ...] = ()  # the degrade steps run for this admission


def _release_cached(device: str) -> None:
    """Hand the allocator's cached blocks back, so freed tensors show up in the next reading."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return
    kind, _ = _device_type(device)
    if kind == "cuda" and torch.cuda.is_available():
        torch.cuda.empty_cache()
    elif kind == "mps" and torch.backends.mps.is_available():
        torch.mps.empty_cache()


class MemoryGuard:
    """Watermark policy for one engine. Owns the degrade steps, their order and their counts."""

    def __init__(self, settings: EngineSettings = EngineSettings(), reader: MemoryReader = system_memory_reader,
                 sleep: Callable[[float], None] = time.sleep, poll_seconds: float = 0.5,
                 steps: Sequence[DegradeStep] = (), release: Callable[[str], None] = _release_cached) -> None:
        self.watermark = settings.memory_watermark
        self.policy = settings.on_memory_pressure
        self.wait_seconds = settings.memory_wait_seconds
        self._reader = reader
        self._sleep = sleep
        self._poll = poll_seconds
        self._release = release
        self._steps: list[DegradeStep] = []
        self._applied: list[DegradeStep] = []  # steps with a restore, in the order they ran
        self._lock = threading.Lock()
        self.decisions: dict[str, int] = {"shrunk": 0, "cpu": 0, "waited": 0, "refused": 0}
        self._step_counts: dict[str, int] = {}
        for step in steps:
            self.add_step(step)

    # ---- registration ------------------------------------------------------------------
    def add_step(self, step: DegradeStep) -> None:
        """Register a degrade step; steps run by ``order`` (then registration order)."""
        with self._lock:
            if any(s.name == step.name for s in self._steps):
                raise ValueError(f"degrade step {step.name!r} registered twice")
            self._steps.append(step)
            self._steps.sort(key=lambda s: s.order)  # stable: equal orders keep registration order
            self._step_counts.setdefault(step.name, 0)

    def add_shrinker(self, name: str, shrink: Shrinker, order: int = ORDER_OTHER) -> None:
        """Register a cache to shrink under pressure (a step without restore)."""
        self.add_step(DegradeStep(name, shrink, order))

    @property
    def steps(self) -> tuple[DegradeStep, ...]:
        return tuple(self._steps)

    def counts(self) -> dict[str, int]:
        """How often each step ran, and the outcomes (``refused``, ``cpu``, ``waited``, ``restored``)."""
        with self._lock:
            out = {f"step:{k}": v for k, v in self._step_counts.items()}
            out.update({k: v for k, v in self.decisions.items() if k != "shrunk"})
            out["restored"] = self.decisions.get("restored", 0)
            return out

    # ---- the decision ------------------------------------------------------------------
    def over(self, device: str) -> tuple[bool, MemoryReading]:
        reading = self._reader(device)
        return reading.total > 0 and reading.fraction > self.watermark, reading

    def admit(self, device: str) -> Admission:
        """Decide where the next piece of work on ``device`` runs (see the module docstring)."""
        over, reading = self.over(device)
        if not over:
            self._maybe_restore(device, reading)
            return Admission(device, "ok", reading)
        ran: list[str] = []
        with self._lock:
            for step in [s for s in self._steps if s.applies_to(device)]:
                before = reading
                freed = step.run() or 0
                self._release(device)
                self._step_counts[step.name] = self._step_counts.get(step.name, 0) + 1
                ran.append(step.name)
                if step.restore is not None and step not in self._applied:
                    self._applied.append(step)
                over, reading = self.over(device)
                log.warning("memory on %s at %.0f%% of %s (watermark %.0f%%): %s, %d bytes released, now %.0f%%",
                            device, 100 * before.fraction, before.source or "memory", 100 * self.watermark,
                            step.name, freed, 100 * reading.fraction)
                if not over:
                    self.decisions["shrunk"] += 1
                    return Admission(device, "shrunk", reading, tuple(ran))
        return self._after_steps(device, reading, tuple(ran))

    def _after_steps(self, device: str, reading: MemoryReading, ran: tuple[str, ...]) -> Admission:
        kind, _ = _device_type(device)
        if self.policy == "cpu" and kind not in UNIFIED:
            with self._lock:
                self.decisions["cpu"] += 1
            log.warning("memory on %s still at %.0f%% after %s: running this request on the CPU", device,
                        100 * reading.fraction, ", ".join(ran) or "no degrade step")
            return Admission("cpu", "cpu", reading, ran)
        if self.policy == "wait":
            waited = 0.0
            while waited < self.wait_seconds:
                self._sleep(self._poll)
                waited += self._poll
                over, reading = self.over(device)
                if not over:
                    with self._lock:
                        self.decisions["waited"] += 1
                    log.warning("memory on %s fell to %.0f%% after waiting %.1f s: request admitted", device,
                                100 * reading.fraction, waited)
                    return Admission(device, "waited", reading, ran)
            raise self._refusal(device, reading, f"stayed {100 * reading.fraction:.0f}% full for {waited:.0f} s")
        why = " (on unified memory, moving work to the CPU frees nothing)" if self.policy == "cpu" else ""
        raise self._refusal(device, reading, f"is {100 * reading.fraction:.0f}% full even after "
                            f"{', '.join(ran) or 'every degrade step'}{why}")

    def _refusal(self, device: str, reading: MemoryReading, what: str) -> MemoryPressureError:
        with self._lock:
            self.decisions["refused"] += 1
        message = (f"{device}: {reading.describe()} {what} (memory_watermark {100 * self.watermark:.0f}%, "
                   f"read from {reading.source or 'nothing'})")
        log.error("%s: request refused", message)
        return MemoryPressureError(f"{message}; retry later or lower the load")

    def _maybe_restore(self, device: str, reading: MemoryReading) -> None:
        if not self._applied or reading.total <= 0 or reading.fraction > self.watermark - RESTORE_MARGIN:
            return
        with self._lock:
            applied, self._applied = self._applied, []
            self.decisions["restored"] = self.decisions.get("restored", 0) + len(applied)
        for step in reversed(applied):
            log.info("memory on %s back to %.0f%%: undoing %s", device, 100 * reading.fraction, step.name)
            step.restore()  # type: ignore[misc]


def default_steps(reference_shrink: Shrinker, evict_idle_models: Shrinker) -> list[DegradeStep]:
    """The engine's own steps: the reference cache, then idle models (the scheduler adds its slots)."""
    return [DegradeStep("reference cache", reference_shrink, ORDER_REFERENCE_CACHE),
            DegradeStep("idle models", evict_idle_models, ORDER_IDLE_MODELS)]

