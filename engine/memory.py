"""The memory watermark: when a device is nearly full, shrink the caches first, then degrade new work.

``MemoryGuard.admit(device)`` runs before each request. If the device's used fraction is above the
watermark it asks every registered cache to shrink (reference cache, model pool) and reads again;
if memory is still short it decides by policy: run this request on the CPU, wait for memory (up
to a timeout) or refuse with a typed error. Every such decision is logged and counted. Memory
readings come from an injectable ``reader`` so tests can fake them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.errors import EngineError
from engine.options import EngineSettings

log = logging.getLogger(__name__)


class MemoryPressureError(EngineError, RuntimeError):
    """The device stayed above its memory watermark and the policy does not allow degrading."""


@dataclass(frozen=True)
class MemoryReading:
    """Bytes in use and in total on one device."""

    used: int
    total: int

    @property
    def fraction(self) -> float:
        return self.used / self.total if self.total > 0 else 0.0


MemoryReader = Callable[[str], MemoryReading]  # device string ("cpu", "cuda:0", "mps") -> reading
Shrinker = Callable[[], int]  # frees what it can, returns bytes released (best effort)


def system_memory_reader(device: str) -> MemoryReading:
    """Real readings: CUDA ``mem_get_info`` for GPUs, /proc/meminfo (MemAvailable) for the CPU/MPS."""
    if device.startswith("cuda"):
        import torch

        free, total = torch.cuda.mem_get_info(torch.device(device))
        return MemoryReading(used=total - free, total=total)
    try:
        info = {}
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                key, _, rest = line.partition(":")
                info[key] = int(rest.split()[0]) * 1024
        total = info["MemTotal"]
        return MemoryReading(used=total - info.get("MemAvailable", info.get("MemFree", 0)), total=total)
    except (OSError, KeyError, ValueError, IndexError):
        return MemoryReading(used=0, total=0)  # unknown: never blocks


@dataclass(frozen=True)
class Admission:
    """Where a request may run, and why."""

    device: str  # the device to run on (the requested one, or "cpu" when degraded)
    action: str  # "ok", "shrunk" (caches shrank, then fit), "cpu", "waited"
    reading: MemoryReading


class MemoryGuard:
    """Watermark policy for one engine. Owns the list of caches it may shrink and its decision log."""

    def __init__(self, settings: EngineSettings = EngineSettings(), reader: MemoryReader = system_memory_reader,
                 sleep: Callable[[float], None] = time.sleep, poll_seconds: float = 0.5) -> None:
        self.watermark = settings.memory_watermark
        self.policy = settings.on_memory_pressure
        self.wait_seconds = settings.memory_wait_seconds
        self._reader = reader
        self._sleep = sleep
        self._poll = poll_seconds
        self._shrinkers: list[tuple[str, Shrinker]] = []
        self._lock = threading.Lock()
        self.decisions: dict[str, int] = {"shrunk": 0, "cpu": 0, "waited": 0, "refused": 0}

    def add_shrinker(self, name: str, shrink: Shrinker) -> None:
        """Register a cache to shrink under pressure (called in registration order)."""
        self._shrinkers.append((name, shrink))

    def over(self, device: str) -> tuple[bool, MemoryReading]:
        reading = self._reader(device)
        return reading.total > 0 and reading.fraction > self.watermark, reading

    def admit(self, device: str) -> Admission:
        """Decide where the next piece of work on ``device`` runs (see the module docstring)."""
        over, reading = self.over(device)
        if not over:
            return Admission(device, "ok", reading)
        with self._lock:
            for name, shrink in self._shrinkers:
                freed = shrink()
                over, after = self.over(device)
                log.warning("memory on %s at %.0f%% (watermark %.0f%%): shrank %s, %d bytes released, now %.0f%%",
                            device, 100 * reading.fraction, 100 * self.watermark, name, freed, 100 * after.fraction)
                reading = after
                if not over:
                    self.decisions["shrunk"] += 1
                    return Admission(device, "shrunk", reading)
        if device == "cpu" or self.policy == "refuse":
            self.decisions["refused"] += 1
            log.error("memory on %s still at %.0f%% after shrinking the caches: request refused", device,
                      100 * reading.fraction)
            raise MemoryPressureError(
                f"{device} memory is {100 * reading.fraction:.0f}% full (watermark {100 * self.watermark:.0f}%) "
                "even after shrinking the caches; retry later or lower the load"
            )
        if self.policy == "cpu":
            self.decisions["cpu"] += 1
            log.warning("memory on %s still at %.0f%% after shrinking the caches: running this request on the CPU",
                        device, 100 * reading.fraction)
            return Admission("cpu", "cpu", reading)
        waited = 0.0
        while waited < self.wait_seconds:
            self._sleep(self._poll)
            waited += self._poll
            over, reading = self.over(device)
            if not over:
                self.decisions["waited"] += 1
                log.warning("memory on %s fell to %.0f%% after waiting %.1f s: request admitted", device,
                            100 * reading.fraction, waited)
                return Admission(device, "waited", reading)
        self.decisions["refused"] += 1
        log.error("memory on %s stayed above the watermark for %.1f s: request refused", device, waited)
        raise MemoryPressureError(
            f"{device} memory stayed {100 * reading.fraction:.0f}% full for {waited:.0f} s "
            f"(watermark {100 * self.watermark:.0f}%); retry later"
        )
