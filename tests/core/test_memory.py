"""The memory watermark on every platform: portable readings (faked: a 16 GB Mac, an H200, a Linux box),
the degrade order for unified memory, steps owners register (the scheduler's slots), and the 503."""

from __future__ import annotations

import logging

import pytest

from engine.errors import EngineError, MemoryPressureError
from engine.memory import (
    ORDER_SLOTS,
    DegradeStep,
    MemoryGuard,
    MemoryReading,
    MemorySources,
    MpsMemory,
    memory_samples,
    read_memory,
)
from engine.options import EngineSettings

GIB = 1 << 30
# A 16 GB M1: macOS recommends ~10.7 GB as the GPU working set; Metal holds 9.9 GB for us.
MAC_BUSY_GPU = MemorySources(system=lambda: (11 * GIB, 16 * GIB),
                             mps=lambda: MpsMemory(current=8 * GIB, driver=int(9.9 * GIB),
                                                   recommended_max=int(10.7 * GIB)),
                             cuda=lambda i: None)
MAC_BUSY_SYSTEM = MemorySources(system=lambda: (int(15.5 * GIB), 16 * GIB),
                                mps=lambda: MpsMemory(GIB, 2 * GIB, int(10.7 * GIB)), cuda=lambda i: None)
H200 = MemorySources(system=lambda: (100 * GIB, 128 * GIB), mps=lambda: None,
                     cuda=lambda i: (130 * GIB, 140 * GIB) if i == 0 else (GIB, 140 * GIB))


def test_readings_take_the_tightest_source() -> None:
    r = read_memory("mps", MAC_BUSY_GPU)
    assert r.source == "mps" and r.used == int(9.9 * GIB) and r.total == int(10.7 * GIB)
    r = read_memory("mps", MAC_BUSY_SYSTEM)
    assert r.source == "system" and r.fraction == pytest.approx(15.5 / 16)
    # the CPU reads this process's own memory, never the machine's (issue 32: a busy shared box refused all)
    own = MemorySources(system=lambda: (15 * GIB, 16 * GIB), process=lambda: GIB, host_total=lambda: 16 * GIB,
                        cgroup=lambda: None)
    assert read_memory("cpu", own).source == "process" and read_memory("cpu", own).fraction == 1 / 16
    assert read_memory("cuda:0", H200).fraction == pytest.approx(130 / 140)
    assert read_memory("cuda:1", H200).fraction == pytest.approx(1 / 140)  # the device's own memory, not the host's
    unknown = read_memory("mps", MemorySources(system=lambda: None, mps=lambda: None, cuda=lambda i: None))
    assert unknown.total == 0 and unknown.fraction == 0.0


def test_metrics_samples_list_every_reading() -> None:
    samples = dict((tuple(sorted(k.items())), v) for k, v in memory_samples("mps", MAC_BUSY_GPU))
    assert samples[(("kind", "total"), ("source", "mps"))] == int(10.7 * GIB)
    assert samples[(("kind", "used"), ("source", "system"))] == 11 * GIB


class Pressure:
    """A Mac whose Metal allocation drops by ``relief`` GB per degrade step."""

    def __init__(self, driver_gb: float, relief: list[float]) -> None:
        self.driver_gb, self.relief = driver_gb, list(relief)

    def step(self, name: str, log: list[str]):
        def run() -> int:
            log.append(name)
            freed = self.relief.pop(0) if self.relief else 0.0
            self.driver_gb -= freed
            return int(freed * GIB)
        return run

    def reader(self, device: str) -> MemoryReading:
        sources = MemorySources(system=lambda: (8 * GIB, 16 * GIB),
                                mps=lambda: MpsMemory(0, int(self.driver_gb * GIB), 10 * GIB), cuda=lambda i: None)
        return read_memory(device, sources)


def _guard(pressure: Pressure, log: list[str], policy: str = "cpu", **steps) -> MemoryGuard:
    guard = MemoryGuard(EngineSettings(memory_watermark=0.8, on_memory_pressure=policy), pressure.reader,
                        release=lambda device: None)
    guard.add_step(DegradeStep("idle models", pressure.step("idle models", log), 20))
    guard.add_step(DegradeStep("reference cache", pressure.step("reference cache", log), 10))
    return guard


def test_unified_memory_degrades_in_order_and_counts(caplog: pytest.LogCaptureFixture) -> None:
    log: list[str] = []
    pressure = Pressure(9.5, [0.5, 1.0])  # 95% -> 90% -> 80% (not above the watermark)
    guard = _guard(pressure, log)
    with caplog.at_level(logging.WARNING, logger="engine.memory"):
        a = guard.admit("mps")
    assert (a.device, a.action, a.steps) == ("mps", "shrunk", ("reference cache", "idle models"))
    assert log == ["reference cache", "idle models"]
    assert guard.counts()["step:reference cache"] == 1 and guard.counts()["step:idle models"] == 1
    assert "reference cache" in caplog.text and "of mps" in caplog.text


def test_the_scheduler_registers_its_slots_and_they_come_back() -> None:
    log: list[str] = []
    pressure = Pressure(9.8, [0.1, 0.1])
    guard = _guard(pressure, log)
    slots = {"n": 8}

    def lower() -> int:
        log.append("scheduler slots")
        slots["n"] //= 2
        pressure.driver_gb -= 2.0
        return 0

    guard.add_step(DegradeStep("scheduler slots", lower, ORDER_SLOTS, restore=lambda: slots.update(n=8)))
    assert guard.admit("mps").steps == ("reference cache", "idle models", "scheduler slots")
    assert slots["n"] == 4
    pressure.driver_gb = 5.0  # the load went away: 50% < watermark - margin
    assert guard.admit("mps").action == "ok" and slots["n"] == 8 and guard.counts()["restored"] == 1


def test_unified_memory_refuses_with_a_503_error_instead_of_moving_to_the_cpu() -> None:
    log: list[str] = []
    guard = _guard(Pressure(9.9, []), log, policy="cpu")
    with pytest.raises(MemoryPressureError, match="unified memory") as info:
        guard.admit("mps")
    assert isinstance(info.value, EngineError) and "retry later" in str(info.value)
    assert log == ["reference cache", "idle models"] and guard.counts()["refused"] == 1
    assert guard.counts()["cpu"] == 0


def test_a_discrete_gpu_may_still_run_the_request_on_the_cpu() -> None:
    full = MemoryGuard(EngineSettings(memory_watermark=0.8, on_memory_pressure="cpu"),
                       lambda d: read_memory(d, H200), release=lambda device: None)
    ran: list[str] = []
    full.add_step(DegradeStep("reference cache", lambda: ran.append("refs") or 0, 10))
    full.add_step(DegradeStep("mps only", lambda: ran.append("mps") or 0, 15, devices=("mps",)))
    a = full.admit("cuda:0")
    assert (a.device, a.action) == ("cpu", "cpu") and ran == ["refs"]


def test_steps_are_registered_once() -> None:
    guard = MemoryGuard()
    guard.add_step(DegradeStep("x", lambda: 0))
    with pytest.raises(ValueError, match="twice"):
        guard.add_step(DegradeStep("x", lambda: 0))


def test_a_16_gb_mac_with_6_gb_of_models_is_not_refused() -> None:
    """macOS keeps its memory full of file cache and compressible pages: psutil's available (free + inactive)
    says 1.2 GB, while macOS's own level says 48 % (7.7 GB) would still be given. Metal holds 6.4 GB of its
    10.7 GB budget for our 6 GB of models. The watermark reads what the OS will give: the request is admitted."""
    from engine.memory import system_used

    total, psutil_available, macos_level = 16 * GIB, int(1.2 * GIB), int(0.48 * 16 * GIB)
    metal = MpsMemory(current=6 * GIB, driver=int(6.4 * GIB), recommended_max=int(10.7 * GIB))

    def guard(system) -> MemoryGuard:
        sources = MemorySources(system=lambda: system, mps=lambda: metal, cuda=lambda i: None)
        return MemoryGuard(EngineSettings(memory_watermark=0.9, on_memory_pressure="refuse"),
                           lambda device: read_memory(device, sources), release=lambda device: None)

    seen = system_used(total, psutil_available, macos_level)
    assert seen == (total - macos_level, total)
    admitted = guard(seen).admit("mps")
    assert admitted.device == "mps" and admitted.reading.source == "mps"  # Metal's budget is the tighter one
    with pytest.raises(MemoryPressureError):  # psutil alone (what the watermark read before) refuses it
        guard(system_used(total, psutil_available, None)).admit("mps")
    # a Mac that really is full is still refused: the OS figure only ever adds what psutil leaves out
    assert system_used(total, psutil_available, GIB // 10) == (total - psutil_available, total)
    with pytest.raises(MemoryPressureError):
        guard(system_used(total, GIB // 10, GIB // 10)).admit("mps")
