"""Figures of many concurrent audio streams, one shape for every front door (``bench`` in process,
``loadtest`` over HTTP): first-chunk percentiles, each stream's speed against real time, total
audio seconds per second and errors. Pure Python, no torch: an HTTP client can import it cheaply.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

PERCENTILES = (50, 95, 99)


@dataclass(frozen=True)
class StreamSample:
    """One stream, timed from when it was asked for (seconds)."""

    first_chunk_s: float | None  # until its first audio sample arrived; None: no audio came
    wall_s: float  # until its last byte (or its failure)
    audio_s: float  # seconds of audio received
    error: str | None = None  # None: it completed; else what went wrong ("503", "timeout", ...)

    @property
    def speed(self) -> float:
        """Audio seconds per wall second (1.0 keeps up with playback)."""
        return self.audio_s / self.wall_s if self.wall_s > 0 else 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation between order statistics
    (numpy's default method); ``values`` must not be empty."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _spread(values: Sequence[float], digits: int = 4) -> dict[str, float] | None:
    if not values:
        return None
    out = {f"p{q}": round(percentile(values, q), digits) for q in PERCENTILES}
    out["max"] = round(max(values), digits)
    return out


def summarize(samples: Iterable[StreamSample], wall_s: float) -> dict[str, Any]:
    """The report of ``samples`` run over ``wall_s`` seconds (from the first request to the last byte).

    ``first_chunk_s``: p50/p95/p99/max over the streams that delivered audio; ``stream_speed``:
    min/p50/max of audio s per wall s over the completed streams, and how many fell below real
    time; ``audio_s_per_s``: all audio received (failed streams' partial audio too) over ``wall_s``.
    """
    samples = list(samples)
    done = [s for s in samples if s.error is None]
    speeds = [s.speed for s in done]
    audio = sum(s.audio_s for s in samples)
    return {
        "requests": len(samples),
        "completed": len(done),
        "errors": dict(sorted(Counter(s.error for s in samples if s.error is not None).items())),
        "first_chunk_s": _spread([s.first_chunk_s for s in samples if s.first_chunk_s is not None]),
        "stream_speed": None if not speeds else {
            "min": round(min(speeds), 3), "p50": round(percentile(speeds, 50), 3), "max": round(max(speeds), 3),
            "below_real_time": sum(v < 1.0 for v in speeds),
        },
        "audio_s": round(audio, 3),
        "wall_s": round(wall_s, 3),
        "audio_s_per_s": round(audio / wall_s, 4) if wall_s > 0 else 0.0,
    }


def format_summary(summary: dict[str, Any]) -> str:
    """One line of a :func:`summarize` report."""
    fc, sp = summary["first_chunk_s"], summary["stream_speed"]
    parts = [f"{summary['completed']}/{summary['requests']} ok"]
    if fc:
        parts.append(f"first chunk p50 {fc['p50']:.3f} s, p95 {fc['p95']:.3f} s, p99 {fc['p99']:.3f} s")
    if sp:
        parts.append(f"stream speed min {sp['min']:.2f}x, p50 {sp['p50']:.2f}x real time "
                     f"({sp['below_real_time']} below)")
    parts.append(f"{summary['audio_s_per_s']:.2f} audio s/s in total")
    if summary["errors"]:
        parts.append("errors " + ", ".join(f"{k} x{v}" for k, v in summary["errors"].items()))
    return "; ".join(parts)
