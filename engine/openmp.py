"""PyTorch's OpenMP thread teams on the CPU: a thread that has done its torch work and waits gives its team back.

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

Only libgomp is handled (PyTorch's Linux builds); elsewhere (macOS's libomp, MKL's own runtime) nothing is done.
"""

from __future__ import annotations

import ctypes
import sys
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


T = TypeVar("T")


def releasing(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn``, after which the thread that ran it releases its team (a worker thread's job)."""

    def run(*args, **kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        finally:
            release_team()

    return run
