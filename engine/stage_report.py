"""What runs where, and why: every stage's device, precision and backend as the engine runs it now.

For a Mac user above all: which networks run on the Apple GPU (MPS), which fell back to the CPU (the device
lacked one of their operators; the error says which), in what precision and why (the runtime's decision in
words), and how the CPU's threads are set up (PyTorch's thread pools and how OpenMP threads wait). ``/health``
carries it under ``stages`` and ``sovits-studio doctor`` prints it. Nothing here loads a model or runs work.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from engine.openmp import fits_threads
from engine.platform_env import MPS_FALLBACK_VAR, openmp_waits


def stage_rows(studio: Any) -> list[dict[str, str]]:
    """One row per network stage: ``stage``, ``device``, ``precision``, ``backend`` and ``why`` (the reason for
    the precision, or for the CPU when the device fallback moved the stage there)."""
    moved = studio.fallback.cpu_stages
    rows = []
    for stage, device, precision, backend in studio.stage_plan():
        record = moved.get(stage)
        if record is not None:
            why = f"fp32 on the CPU: {record.device} lacks an operator of this stage ({record.error})"
        else:
            why = studio.runtime.reason_for(stage)
        rows.append({"stage": stage, "device": device, "precision": precision, "backend": backend, "why": why})
    return rows


def stage_report(studio: Any) -> dict[str, Any]:
    """The engine's device, its stages (:func:`stage_rows`), every stage the device fallback moved to the CPU
    with its error and CPU runs (``cfm`` included, which is no network stage of its own), whether single
    operators may fall back on macOS, and the CPU thread setup."""
    import torch

    counts = studio.fallback.counts()
    fallbacks = {stage: {"device": r.device, "error": r.error, "cpu_runs": counts.get(stage, 0)}
                 for stage, r in sorted(studio.fallback.cpu_stages.items())}
    report: dict[str, Any] = {
        "device": str(studio.runtime.device),
        "stages": stage_rows(studio),
        "fallbacks": fallbacks,
        "cpu_threads": {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads(),
                        "cores": os.cpu_count(), "openmp": openmp_waits(),
                        # the engine's threads fit their intra-op count to the cores other processes leave free
                        "fit_to_free_cores": fits_threads()},
    }
    notice = getattr(studio, "device_notice", "")
    if notice:
        report["device_notice"] = notice
    if sys.platform == "darwin" or studio.runtime.device.type == "mps":
        value = os.environ.get(MPS_FALLBACK_VAR, "")
        report["mps_operator_fallback"] = (
            f"{MPS_FALLBACK_VAR}={value or 'unset'}: " +
            ("an operator MPS lacks runs on the CPU inside a stage that stays on MPS (PyTorch does not say which)"
             if value == "1" else "a stage whose operator MPS lacks moves to the CPU whole (listed in fallbacks)"))
    return report


def format_report(report: dict[str, Any]) -> str:
    """The report as a plain-text table (``sovits-studio doctor``)."""
    lines = [f"device: {report['device']}"]
    if report.get("device_notice"):
        lines.append(f"note: {report['device_notice']}")
    rows = [("stage", "device", "precision", "backend", "why")] + [
        (r["stage"], r["device"], r["precision"], r["backend"], r["why"]) for r in report["stages"]]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) + "  " + row[4])
    if report["fallbacks"]:
        lines.append("moved to the CPU (the device lacks an operator):")
        for stage, f in report["fallbacks"].items():
            lines.append(f"  {stage}: from {f['device']}, {f['cpu_runs']} CPU runs: {f['error']}")
    else:
        lines.append("moved to the CPU: none so far")
    if report.get("mps_operator_fallback"):
        lines.append(report["mps_operator_fallback"])
    t = report["cpu_threads"]
    fit = " (the engine's threads: fewer while other processes keep cores busy)" if t.get("fit_to_free_cores") else ""
    lines.append(f"CPU threads: {t['intra_op']} intra-op{fit}, {t['inter_op']} inter-op, {t['cores']} cores; "
                 f"{t['openmp']}")
    return "\n".join(lines)
