"""PyTorch's OpenMP threads on the CPU: a thread that waits gives its team back, and a thread about to work fits
its thread count to the cores other processes leave free.

libgomp (PyTorch's OpenMP on Linux) gives every thread that runs a parallel region a team of worker threads of
its own, and keeps it until that thread exits. After each region the workers spin for the next one (300,000
spins, about 3 ms) before they sleep, but only 100 times while the process holds more of them than it has CPUs,
idle teams included. The serving scheduler runs a request's stages on several threads (the caller's front end,
the decode loop, the acoustic thread, the text thread): with every team kept, each stage found the others' idle
teams, the spin was throttled, and the T2S decode (about 70 regions a token) ran as slowly as with
``OMP_WAIT_POLICY=PASSIVE`` (docs/benchmarks.md, issue 34). So each of those threads releases its team when its
work is done and it is about to wait (:func:`release_team`): a lone request's stages each find one team in the
process and keep libgomp's full spin; stages that really overlap hold a team each, and libgomp throttles the
spin, as it should when the cores are oversubscribed. An idle server holds no team at all.

The spin has a price: it is fast only while the team has its cores to itself. When another process keeps a
core busy (a second engine, a build, a load-test client), a worker spins while its master waits for a core, every
region stalls for a scheduler slice, and the decode falls to a tenth of its speed or less (one busy process
beside a 2-core decode: 3.8 tokens/s instead of 50; docs/benchmarks.md). So the engine's threads also fit their
torch thread count to the cores other processes leave free (:func:`fit_threads`, Linux, libgomp's spin, no
``OMP_NUM_THREADS``): one thread when another process takes a core of two, the configured count again when it is
gone. The decode loop refits every second of decoding, the other threads before each piece of work.

Only libgomp is handled (PyTorch's Linux builds); elsewhere (macOS's libomp, MKL's own runtime) nothing is done.
"""

from __future__ import annotations

import ctypes
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TypeVar

OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: the calling thread's pool goes; the runtime stays initialised

_libraries: tuple | None = None  # the libgomp copies loaded in this process (found once torch is loaded)


def loaded_libgomp() -> tuple[str, ...]:
    """Paths of the libgomp copies mapped into this process (Linux; empty elsewhere or before torch loads)."""
    if not sys.platform.startswith("linux"):
        return ()
    paths = set()
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
                path = fields[5].strip() if len(fields) == 6 else ""
                if "/libgomp" in path and ".so" in path:
                    paths.add(path)
    except OSError:
        return ()
    return tuple(sorted(paths))


def _runtimes() -> tuple:
    global _libraries
    if _libraries is None:
        if "torch" not in sys.modules:  # nothing to release yet; look again once torch has loaded its runtime
            return ()
        found = []
        for path in loaded_libgomp():
            try:
                lib = ctypes.CDLL(path)
                lib.omp_pause_resource.argtypes = [ctypes.c_int, ctypes.c_int]
                lib.omp_get_initial_device.restype = ctypes.c_int
                found.append(lib)
            except (OSError, AttributeError):  # a libgomp older than OpenMP 5.0 (GCC 9) has no pause
                continue
        _libraries = tuple(found)
    return _libraries


def release_team() -> bool:
    """Release the calling thread's OpenMP team (its worker threads end; the next parallel region on this
    thread starts a new team, which costs about 0.1 ms). Call it outside any torch operation, from a thread
    that is about to wait. Returns True when a libgomp was there to ask."""
    libs = _runtimes()
    for lib in libs:
        lib.omp_pause_resource(OMP_PAUSE_SOFT, lib.omp_get_initial_device())
    return bool(libs)


# ---- thread counts that fit the free cores -------------------------------------------------------
FIT_INTERVAL_S = 1.0  # a busy thread (the decode loop) fits its thread count again after this long
SAMPLE_S = 0.25  # other processes' CPU use is read over windows at least this long
FREE_SHARE = 0.6  # a core counts as free when other processes leave this share of it (or more)
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc's clock ticks per second


def fitted_threads(configured: int, cores: int, others: float) -> int:
    """Intra-op threads for a thread configured for ``configured`` on a machine of ``cores`` of which other
    processes keep ``others`` busy: the free cores (each free when at least FREE_SHARE of it is), at least 1."""
    free = math.floor(cores - others + (1.0 - FREE_SHARE) + 1e-9)
    return max(1, min(configured, free))


class OtherLoad:
    """How many cores other processes kept busy lately: the machine's busy time (/proc/stat) less this process's
    own (/proc/self/stat), over the time since the last reading (at least SAMPLE_S apart). Linux only."""

    def __init__(self, read: Callable[[], tuple[float, int, int] | None] | None = None) -> None:
        self._read = read or _read_proc
        self._lock = threading.Lock()
        self._last: tuple[float, int, int] | None = None
        self._cores = 0.0

    def cores(self) -> float | None:
        """Cores (0 ..) other processes used since the last reading; None where it cannot be read."""
        with self._lock:
            now = self._read()
            if now is None:
                return None
            if self._last is None:
                self._last = now
                return 0.0  # no window yet: assume the cores free; the next reading tells
            if now[0] - self._last[0] >= SAMPLE_S:
                (t0, busy0, own0), (t1, busy1, own1) = self._last, now
                self._cores = max(0.0, ((busy1 - busy0) - (own1 - own0)) / _TICKS / (t1 - t0))
                self._last = now
            return self._cores


def _read_proc() -> tuple[float, int, int] | None:
    """(monotonic seconds, the machine's busy clock ticks, this process's clock ticks), or None."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()  # cpu user nice system idle iowait irq softirq steal ...
        with open("/proc/self/stat", encoding="ascii") as f:
            own = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    busy = sum(int(x) for x in fields[1:4]) + sum(int(x) for x in fields[6:9])  # user nice system irq softirq steal
    return time.monotonic(), busy, int(own[11]) + int(own[12])


_other_load = OtherLoad()
_configured: int | None = None  # torch's intra-op threads before the first fit (the user's or torch's choice)


def spin_waits() -> bool:
    """Whether this process's OpenMP workers spin between regions (libgomp loaded, no passive policy)."""
    return bool(_runtimes()) and os.environ.get("OMP_WAIT_POLICY", "").strip().upper() != "PASSIVE"


def fits_threads() -> bool:
    """Whether :func:`fit_threads` adapts the thread count: libgomp's spin, and no count fixed in
    ``OMP_NUM_THREADS`` (the user's, or Ray's per replica). A fixed count keeps float rounding the same at any
    machine load: matrix products on 1 and 2 threads differ in the last bits (T2S logits by about 2e-6)."""
    return spin_waits() and not os.environ.get("OMP_NUM_THREADS", "").strip()


def fit_threads(load: OtherLoad | None = None) -> int:
    """Set the calling thread's torch intra-op threads to the cores other processes leave free (at most the
    configured count); call it before a piece of CPU work. Where it does not adapt (:func:`fits_threads`) or
    the load cannot be read, the configured count. Returns the thread count now set."""
    global _configured
    import torch

    if _configured is None:
        _configured = torch.get_num_threads()
    want = _configured
    if fits_threads():
        others = (load or _other_load).cores()
        if others is not None:
            want = fitted_threads(_configured, os.cpu_count() or 1, others)
    if torch.get_num_threads() != want:  # per thread (OpenMP's and MKL's settings); also the default of new threads
        torch.set_num_threads(want)
    return want


T = TypeVar("T")


def cpu_job(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` as one piece of CPU work of a thread that waits between pieces (the text thread, the caller's
    front end): its thread count fitted before (:func:`fit_threads`), its team released after."""

    def run(*args, **kwargs) -> T:
        fit_threads()
        try:
            return fn(*args, **kwargs)
        finally:
            release_team()

    return run
