"""The figures shared by bench and loadtest: percentiles as numpy computes them, and the summary."""

from __future__ import annotations

import numpy as np
import pytest

from engine.stream_stats import StreamSample, format_summary, percentile, summarize


def test_percentile_matches_numpy_linear() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 10, 101):
        values = rng.exponential(size=n).tolist()
        for q in (0, 50, 95, 99, 100):
            assert percentile(values, q) == pytest.approx(np.percentile(values, q))
    with pytest.raises(ValueError):
        percentile([], 50)


def test_summary_counts_failures_apart_and_keeps_their_audio() -> None:
    samples = [StreamSample(0.5, 4.0, 8.0), StreamSample(1.0, 2.0, 1.0), StreamSample(None, 0.1, 0.0, "503"),
               StreamSample(2.0, 10.0, 3.0, "timeout")]
    s = summarize(samples, wall_s=10.0)
    assert s["requests"] == 4 and s["completed"] == 2 and s["errors"] == {"503": 1, "timeout": 1}
    assert s["first_chunk_s"]["p50"] == pytest.approx(1.0) and s["first_chunk_s"]["max"] == 2.0
    assert s["stream_speed"] == {"min": 0.5, "p50": 1.25, "max": 2.0, "below_real_time": 1}
    assert s["audio_s"] == 12.0 and s["audio_s_per_s"] == pytest.approx(1.2)
    assert "2/4 ok" in format_summary(s) and "503 x1" in format_summary(s)
    empty = summarize([], wall_s=1.0)
    assert empty["first_chunk_s"] is None and empty["stream_speed"] is None and empty["audio_s_per_s"] == 0
