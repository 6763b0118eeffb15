"""The Prometheus text exposition we write: histogram buckets cumulative, label escaping, callbacks,
and registries that never share numbers."""

from __future__ import annotations

import re
import threading

import pytest

from studio.http.metrics import Registry, ServerMetrics, host_memory

# one sample line of the text format: name, optional {labels}, a value
SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? '
                    r'(-?[0-9.e+-]+|\+Inf|-Inf|NaN)$')


def _parse(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        assert SAMPLE.match(line), line
        key, value = line.rsplit(" ", 1)
        out[key] = float(value)
    return out


def test_histogram_buckets_are_cumulative_with_sum_and_count() -> None:
    r = Registry()
    h = r.histogram("lat_seconds", "latency", ("endpoint",), buckets=(0.1, 1.0))
    for v in (0.05, 0.5, 0.5, 3.0):
        h.observe(v, {"endpoint": "/tts"})
    s = _parse(r.render())
    assert s['lat_seconds_bucket{endpoint="/tts",le="0.1"}'] == 1
    assert s['lat_seconds_bucket{endpoint="/tts",le="1"}'] == 3
    assert s['lat_seconds_bucket{endpoint="/tts",le="+Inf"}'] == 4
    assert s['lat_seconds_count{endpoint="/tts"}'] == 4
    assert s['lat_seconds_sum{endpoint="/tts"}'] == pytest.approx(4.05)
    assert "# TYPE lat_seconds histogram" in r.render()


def test_label_values_are_escaped() -> None:
    r = Registry()
    c = r.counter("x_total", "help", ("path",))
    c.inc({"path": 'a"b\\c\nd'})
    assert 'x_total{path="a\\"b\\\\c\\nd"} 1' in r.render()


def test_counters_only_go_up_and_labels_must_match() -> None:
    r = Registry()
    c = r.counter("y_total", "help", ("a",))
    with pytest.raises(ValueError):
        c.inc({"a": "1"}, -1)
    with pytest.raises(ValueError):
        c.inc({"b": "1"})
    with pytest.raises(ValueError):
        r.counter("y_total", "again")


def test_concurrent_increments_are_not_lost() -> None:
    r = Registry()
    c = r.counter("z_total", "help")
    threads = [threading.Thread(target=lambda: [c.inc() for _ in range(2000)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _parse(r.render())["z_total"] == 8000


def test_server_metrics_export_queue_caches_and_memory() -> None:
    stats = {"reference": (3, 1), "models": (7, 2)}
    m = ServerMetrics(cache_stats=lambda: stats, queue_length=lambda: 5)
    m.requests.inc({"endpoint": "/tts", "status": "200"})
    m.first_chunk.observe(0.2, {"endpoint": "/tts"})
    s = _parse(m.render())
    assert s["sovits_queue_length"] == 5
    assert s['sovits_cache_hits_total{cache="reference"}'] == 3
    assert s['sovits_cache_misses_total{cache="models"}'] == 2
    assert s['sovits_requests_total{endpoint="/tts",status="200"}'] == 1
    assert s['sovits_first_chunk_seconds_count{endpoint="/tts"}'] == 1
    assert s['sovits_host_memory_bytes{kind="rss"}'] > 1e6  # this very test process
    stats["reference"] = (4, 1)  # callbacks are read at scrape time
    assert _parse(m.render())['sovits_cache_hits_total{cache="reference"}'] == 4


def test_two_servers_keep_separate_numbers() -> None:
    a, b = ServerMetrics(), ServerMetrics()
    a.requests.inc({"endpoint": "/tts", "status": "200"})
    assert "sovits_requests_total{" not in b.render()


def test_a_failing_probe_does_not_break_the_scrape() -> None:
    def broken():
        raise RuntimeError("probe failed")

    m = ServerMetrics(cache_stats=broken)
    assert "sovits_cache_hits_total" in m.render()
    assert host_memory()
