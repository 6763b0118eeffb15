"""The process environment: what must be set before torch is imported (no torch import here), the libraries'
progress bars and chatter (:func:`quiet_libraries`, called by the front doors), the open-files limit (one
descriptor per socket) that a server or a load test raises to fit its connections, and the GIL's switch interval
(:func:`set_switch_interval`)."""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

MPS_FALLBACK_VAR = "PYTORCH_ENABLE_MPS_FALLBACK"


def enable_mps_fallback(environ: MutableMapping[str, str] | None = None, platform: str | None = None) -> bool:
    """On macOS, let PyTorch run operators MPS lacks on the CPU. Call before the first ``import torch``.

    A value the user already set wins. Returns True when the variable is (now) enabled.
    """
    environ = os.environ if environ is None else environ
    platform = sys.platform if platform is None else platform
    if platform != "darwin":
        return False
    environ.setdefault(MPS_FALLBACK_VAR, "1")
    return environ[MPS_FALLBACK_VAR] == "1"


OMP_WAIT_VAR = "OMP_WAIT_POLICY"
OMP_SPIN_VAR = "GOMP_SPINCOUNT"


def passive_cpu_threads(environ: MutableMapping[str, str] | None = None) -> bool:
    """Let PyTorch's idle OpenMP threads sleep instead of spinning (``OMP_WAIT_POLICY=PASSIVE``). Call before
    the first ``import torch``: libgomp reads it once, when it is loaded.

    The commands do not set it (libgomp's default spin-then-sleep makes the T2S decode about 1.7x faster on an
    otherwise idle machine, and engine.openmp keeps the serving path at that speed); it is for processes that
    share the cores with other CPU-heavy work, where a spinning worker holds a core that work needs and the
    decode falls to a fraction of its speed: the test suite (several suites on one machine) and the benchmarks'
    ``--omp-wait passive`` (docs/benchmarks.md, "OpenMP waits"). A value the user set (``OMP_WAIT_POLICY`` or
    ``GOMP_SPINCOUNT``) wins. Returns True when the passive policy is (now) asked for."""
    environ = os.environ if environ is None else environ
    if OMP_SPIN_VAR in environ and OMP_WAIT_VAR not in environ:
        return False
    environ.setdefault(OMP_WAIT_VAR, "PASSIVE")
    return environ[OMP_WAIT_VAR].strip().upper() == "PASSIVE"


def openmp_waits(environ: MutableMapping[str, str] | None = None) -> str:
    """How this process's OpenMP threads wait, as set in the environment (for reports)."""
    environ = os.environ if environ is None else environ
    policy = environ.get(OMP_WAIT_VAR, "").strip() or "default"
    spin = environ.get(OMP_SPIN_VAR)
    return f"{OMP_WAIT_VAR}={policy}" + (f" {OMP_SPIN_VAR}={spin}" if spin else "")


HUB_BARS_VAR = "HF_HUB_DISABLE_PROGRESS_BARS"  # read by huggingface_hub (and so transformers) when imported


def quiet_libraries(verbose: bool = False) -> None:
    """A front door's output without the libraries' loading chatter: no transformers / huggingface_hub progress
    bars ("Loading weights") and no jieba dictionary messages ("Building prefix dict"); ``verbose`` turns the bars
    back on. Call before the engine loads models, in every process that loads them (a cluster replica too)."""
    import logging

    if verbose:
        if "transformers" in sys.modules:
            from transformers.utils import logging as hf_logging

            hf_logging.enable_progress_bar()
        return
    os.environ.setdefault(HUB_BARS_VAR, "1")  # read when huggingface_hub / transformers are imported
    if "transformers" in sys.modules:  # already imported (a test, an embedding program): tell it directly
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    jieba = logging.getLogger("jieba")  # jieba logs its dictionary load at DEBUG, and sets that level on import
    if _warnings_only not in jieba.filters:
        jieba.addFilter(_warnings_only)


def _warnings_only(record) -> bool:
    import logging

    return record.levelno >= logging.WARNING


def torch_already_imported() -> bool:
    return "torch" in sys.modules


def raise_open_files(want: int) -> tuple[int, int]:
    """Raise the soft limit of open files to at least ``want``: within the hard limit, or beyond it where the
    process is allowed to raise the hard limit too. Returns (soft, hard) afterwards; (want, want) where the
    platform has no such limit (Windows)."""
    try:
        import resource
    except ImportError:
        return want, want
    inf = resource.RLIM_INFINITY
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == inf or soft >= want:
        return soft, hard
    if hard != inf and hard < want:
        try:  # privileged: a server machine's default hard limit (often 1024-4096) is no ceiling
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
            return resource.getrlimit(resource.RLIMIT_NOFILE)
        except (ValueError, OSError):
            pass
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == inf else min(want, hard), hard))
    except (ValueError, OSError):
        pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def set_switch_interval(ms: float) -> None:
    """The interpreter's GIL switch interval for this process (``EngineSettings.switch_interval_ms``; 0 leaves
    Python's own). A process setting, so the front door that owns the process sets it, not the engine."""
    if ms > 0:
        sys.setswitchinterval(ms / 1000)
