"""Which accelerator the device tests compare against the CPU, and where their measurements go.

``SOVITS_TEST_DEVICE`` chooses (``cuda``, ``cuda:1``, ``mps``; ``cpu`` runs the comparisons against
the CPU itself, to check the tests; ``none`` skips). Without it: CUDA when present, else MPS when it
can really run a kernel (GitHub's macOS runners report MPS available but cannot allocate on it).
"""

from __future__ import annotations

import atexit
import json
import os
import threading

import torch


def mps_usable() -> bool:
    if not torch.backends.mps.is_available():
        return False
    try:
        return bool((torch.ones(4, device="mps") * 2).sum().item() == 8)
    except RuntimeError:  # "MPS backend out of memory (MPS allocated: 0 bytes ...)" on virtual machines
        return False


def pick_accelerator() -> str | None:
    chosen = os.environ.get("SOVITS_TEST_DEVICE", "").strip().lower()
    if chosen == "none":
        return None
    if chosen:
        return chosen
    if torch.cuda.is_available():
        return "cuda:0"
    return "mps" if mps_usable() else None


ACCELERATOR = pick_accelerator()
_lock = threading.Lock()
_measured: list[dict] = []


def record(metric: str, precision: str, case: str, error: float, tolerance: float) -> None:
    """Keep one measurement; written to $SOVITS_DEVICE_REPORT (JSON) when the run ends."""
    with _lock:
        _measured.append({"device": ACCELERATOR, "metric": metric, "precision": precision, "case": case,
                          "error": error, "tolerance": tolerance, "ok": error <= tolerance})


def _write() -> None:
    path = os.environ.get("SOVITS_DEVICE_REPORT")
    if path and _measured:
        name = torch.cuda.get_device_name(0) if ACCELERATOR and ACCELERATOR.startswith("cuda") else ACCELERATOR
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"device": name, "torch": torch.__version__, "measured": _measured}, f, indent=1)


atexit.register(_write)
