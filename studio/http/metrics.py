"""Prometheus metrics in the text exposition format (version 0.0.4), without a client library.

A :class:`Registry` owns its metrics (no process-wide default registry), so two apps in one process
(tests, the web UI mounting the API) never mix their numbers. All updates take the registry's lock.
:class:`ServerMetrics` is the set the HTTP server exports.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)  # seconds

LabelValues = tuple[str, ...]
Sample = tuple[Mapping[str, str], float]  # (labels, value) from a scrape-time callback


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Sequence[str], values: Sequence[str], extra: tuple[str, str] | None = None) -> str:
    pairs = [f'{n}="{_escape(str(v))}"' for n, v in zip(names, values)]
    if extra is not None:
        pairs.append(f'{extra[0]}="{_escape(extra[1])}"')
    return "{" + ",".join(pairs) + "}" if pairs else ""


def _number(x: float) -> str:
    x = float(x)
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    if math.isnan(x):
        return "NaN"
    return str(int(x)) if x.is_integer() and abs(x) < 2**53 else repr(x)


@dataclass
class _Metric:
    name: str
    help: str
    label_names: tuple[str, ...]
    lock: threading.Lock

    kind = "untyped"

    def _key(self, labels: Mapping[str, str] | None) -> LabelValues:
        labels = dict(labels or {})
        if set(labels) != set(self.label_names):
            raise ValueError(f"{self.name}: labels must be exactly {self.label_names}, got {tuple(labels)}")
        return tuple(str(labels[n]) for n in self.label_names)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


@dataclass
class _Scalar(_Metric):
    """One number per label set (counters and gauges render alike)."""

    values: dict[LabelValues, float] = field(default_factory=dict)

    def _add(self, labels: Mapping[str, str] | None, amount: float) -> None:
        key = self._key(labels)
        with self.lock:
            self.values[key] = self.values.get(key, 0.0) + amount

    def render(self) -> list[str]:
        with self.lock:
            items = sorted(self.values.items())
        return self.header() + [f"{self.name}{_labels(self.label_names, k)} {_number(v)}" for k, v in items]


@dataclass
class Counter(_Scalar):
    kind = "counter"

    def inc(self, labels: Mapping[str, str] | None = None, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: a counter only goes up")
        self._add(labels, amount)


@dataclass
class Gauge(_Scalar):
    kind = "gauge"

    def set(self, value: float, labels: Mapping[str, str] | None = None) -> None:
        key = self._key(labels)
        with self.lock:
            self.values[key] = float(value)

    def add(self, amount: float, labels: Mapping[str, str] | None = None) -> None:
        self._add(labels, amount)


@dataclass
class Histogram(_Metric):
    buckets: tuple[float, ...] = LATENCY_BUCKETS
    # label values -> (count per bucket (cumulative at render), sum, count)
    values: dict[LabelValues, tuple[list[int], float, int]] = field(default_factory=dict)
    kind = "histogram"

    def __post_init__(self) -> None:
        if list(self.buckets) != sorted(set(self.buckets)) or not self.buckets:
            raise ValueError(f"{self.name}: buckets must be increasing and non-empty")

    def observe(self, value: float, labels: Mapping[str, str] | None = None) -> None:
        key = self._key(labels)
        with self.lock:
            counts, total, n = self.values.get(key) or ([0] * len(self.buckets), 0.0, 0)
            for i, upper in enumerate(self.buckets):
                if value <= upper:
                    counts[i] += 1
                    break
            self.values[key] = (counts, total + value, n + 1)

    def render(self) -> list[str]:
        with self.lock:
            items = sorted((k, (list(c), s, n)) for k, (c, s, n) in self.values.items())
        lines = self.header()
        for key, (counts, total, n) in items:
            running = 0
            for upper, c in zip(self.buckets, counts):
                running += c
                lines.append(f"{self.name}_bucket{_labels(self.label_names, key, ('le', _number(upper)))} {running}")
            lines.append(f"{self.name}_bucket{_labels(self.label_names, key, ('le', '+Inf'))} {n}")
            lines.append(f"{self.name}_sum{_labels(self.label_names, key)} {_number(total)}")
            lines.append(f"{self.name}_count{_labels(self.label_names, key)} {n}")
        return lines


@dataclass
class Callback(_Metric):
    """A gauge or counter whose samples a function returns at scrape time (memory, cache stats)."""

    fn: Callable[[], Iterable[Sample]] = lambda: ()
    metric_kind: str = "gauge"

    @property
    def kind(self) -> str:  # type: ignore[override]
        return self.metric_kind

    def render(self) -> list[str]:
        try:
            samples = list(self.fn())
        except Exception:  # a failing probe must not break the whole scrape
            samples = []
        return self.header() + [
            f"{self.name}{_labels(self.label_names, self._key(labels))} {_number(v)}" for labels, v in samples
        ]


class Registry:
    """Metrics of one app, rendered in registration order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._metrics: dict[str, _Metric] = {}

    def _add(self, metric: _Metric) -> _Metric:
        if metric.name in self._metrics:
            raise ValueError(f"metric {metric.name} registered twice")
        self._metrics[metric.name] = metric
        return metric

    def counter(self, name: str, help: str, labels: Sequence[str] = ()) -> Counter:
        metric = Counter(name, help, tuple(labels), self._lock)
        if not labels:
            metric.values[()] = 0.0  # an unlabelled series exists from the start
        return self._add(metric)  # type: ignore[return-value]

    def gauge(self, name: str, help: str, labels: Sequence[str] = ()) -> Gauge:
        metric = Gauge(name, help, tuple(labels), self._lock)
        if not labels:
            metric.values[()] = 0.0
        return self._add(metric)  # type: ignore[return-value]

    def histogram(self, name: str, help: str, labels: Sequence[str] = (),
                  buckets: Sequence[float] = LATENCY_BUCKETS) -> Histogram:
        return self._add(Histogram(name, help, tuple(labels), self._lock, tuple(buckets)))  # type: ignore[return-value]

    def callback(self, name: str, help: str, fn: Callable[[], Iterable[Sample]], labels: Sequence[str] = (),
                 kind: str = "gauge") -> Callback:
        if kind not in ("gauge", "counter"):
            raise ValueError("kind must be gauge or counter")
        return self._add(Callback(name, help, tuple(labels), self._lock, fn, kind))  # type: ignore[return-value]

    def render(self) -> str:
        lines: list[str] = []
        for metric in list(self._metrics.values()):
            lines += metric.render()  # type: ignore[attr-defined]
        return "\n".join(lines) + "\n"


# ---- process probes ------------------------------------------------------------------------


def host_memory() -> list[Sample]:
    """Resident set size of this process (and the peak), in bytes."""
    out: list[Sample] = []
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            rss_pages = int(f.read().split()[1])
        out.append(({"kind": "rss"}, float(rss_pages * os.sysconf("SC_PAGE_SIZE"))))
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        out.append(({"kind": "peak_rss"}, float(peak if sys.platform == "darwin" else peak * 1024)))
    except (ImportError, OSError):
        pass
    return out


def device_memory() -> list[Sample]:
    """Accelerator memory in bytes per device (CUDA allocated/reserved, MPS allocated); none on CPU.
    Reads torch only when it is already imported (a scrape never pays for the import)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    out: list[Sample] = []
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i in range(torch.cuda.device_count()):
            dev = f"cuda:{i}"
            out.append(({"device": dev, "kind": "allocated"}, float(torch.cuda.memory_allocated(i))))
            out.append(({"device": dev, "kind": "reserved"}, float(torch.cuda.memory_reserved(i))))
    mps = getattr(torch, "mps", None)
    if mps is not None and torch.backends.mps.is_available():
        try:
            out.append(({"device": "mps", "kind": "allocated"}, float(mps.current_allocated_memory())))
        except (AttributeError, RuntimeError):
            pass
    return out


class ServerMetrics:
    """The metrics the HTTP server exports. ``cache_stats`` returns ``{cache: (hits, misses)}``."""

    def __init__(self, cache_stats: Callable[[], Mapping[str, tuple[int, int]]] | None = None,
                 queue_length: Callable[[], int] | None = None) -> None:
        self.registry = r = Registry()
        self.requests = r.counter("sovits_requests_total", "HTTP requests by endpoint and status code sent "
                                  "(499: the client left before any answer).", ("endpoint", "status"))
        self.outcomes = r.counter("sovits_request_outcomes_total", "HTTP requests by endpoint and how they ended: "
                                  "completed, cancelled_by_client, failed_mid_stream, rejected_busy, unauthorised, "
                                  "invalid, timed_out, failed.", ("endpoint", "outcome"))
        self.latency = r.histogram("sovits_request_duration_seconds",
                                   "Time from receiving a synthesis request to its last byte.", ("endpoint",))
        self.first_chunk = r.histogram("sovits_first_chunk_seconds",
                                       "Time from receiving a synthesis request to its first audio byte.",
                                       ("endpoint",))
        self.in_progress = r.gauge("sovits_requests_in_progress", "Synthesis requests being computed now.")
        self.audio_seconds = r.counter("sovits_audio_seconds_total", "Seconds of audio delivered to clients "
                                       "(a whole file once sent completely, a stream chunk by chunk).")
        r.callback("sovits_queue_length", "Synthesis requests waiting for a worker.",
                   lambda: [({}, float(queue_length()))] if queue_length else [])
        r.callback("sovits_cache_hits_total", "Cache hits by cache.", self._cache_samples(0, cache_stats),
                   ("cache",), kind="counter")
        r.callback("sovits_cache_misses_total", "Cache misses by cache.", self._cache_samples(1, cache_stats),
                   ("cache",), kind="counter")
        r.callback("sovits_host_memory_bytes", "Host memory of the server process.", host_memory, ("kind",))
        r.callback("sovits_device_memory_bytes", "Accelerator memory held by PyTorch.", device_memory,
                   ("device", "kind"))

    @staticmethod
    def _cache_samples(index: int, stats: Callable[[], Mapping[str, tuple[int, int]]] | None
                       ) -> Callable[[], list[Sample]]:
        def samples() -> list[Sample]:
            if stats is None:
                return []
            return [({"cache": name}, float(v[index])) for name, v in sorted(stats().items())]

        return samples

    def render(self) -> str:
        return self.registry.render()


def register_engine_metrics(registry: Registry, studio) -> None:
    """The engine's own counters: stages run on the CPU because the accelerator lacks an operator
    (``studio.fallback``), memory degrade steps and refusals (``studio.memory``), and the memory readings
    the watermark compares (engine.memory). Read at scrape time; a studio without them exports nothing."""

    def fallbacks() -> list[Sample]:
        counts = studio.fallback.counts() if getattr(studio, "fallback", None) is not None else {}
        return [({"stage": stage}, float(n)) for stage, n in sorted(counts.items())]

    def degrade() -> list[Sample]:
        counts = studio.memory.counts() if getattr(studio, "memory", None) is not None else {}
        return [({"step": step.removeprefix("step:")}, float(n)) for step, n in sorted(counts.items())]

    def readings() -> list[Sample]:
        from engine.memory import memory_samples

        runtime = getattr(studio, "runtime", None)
        return memory_samples(str(runtime.device)) if runtime is not None else []

    def serving_events(name: str) -> Callable[[], list[Sample]]:
        def samples() -> list[Sample]:
            events = studio.serving_events() if hasattr(studio, "serving_events") else {}
            return [({}, float(events.get(name, 0)))]

        return samples

    def captures(prefix: str) -> Callable[[], list[Sample]]:
        def samples() -> list[Sample]:
            events = studio.serving_events() if hasattr(studio, "serving_events") else {}
            return [({"phase": phase}, float(events.get(f"{prefix}_{phase}", 0))) for phase in ("warmup", "serving")]

        return samples

    registry.callback("sovits_scheduler_rebuilds_total", "Times a scheduler rebuilt its decoding state after a "
                      "failed decode step (the requests in that step failed with 503).", serving_events("rebuild"),
                      kind="counter")
    registry.callback("sovits_acoustic_failures_total", "Acoustic rounds (or jobs) that failed; the requests in "
                      "them failed.", serving_events("acoustic_failure"), kind="counter")
    registry.callback("sovits_graph_captures_total", "CUDA graphs of the decode step captured, at warm-up or "
                      "while serving (then under a barrier, at a quiet moment).", captures("graphs_captured"),
                      ("phase",), kind="counter")
    registry.callback("sovits_prefill_graph_captures_total", "CUDA graphs of T2S prefills (a bucket of rows and "
                      "width) captured, at warm-up or while serving (then under a barrier, right after the first "
                      "prefill of that bucket, which ran eagerly).", captures("prefill_graphs_captured"),
                      ("phase",), kind="counter")
    registry.callback("sovits_acoustic_graph_captures_total", "CUDA graphs of batched acoustic shapes captured, at "
                      "warm-up or while serving (then under a barrier, a few before a round).",
                      captures("acoustic_graphs_captured"), ("phase",), kind="counter")
    def work(names: tuple[str, ...], label: str, suffix: str = "_seconds") -> Callable[[], list[Sample]]:
        def samples() -> list[Sample]:
            done = studio.serving_work() if hasattr(studio, "serving_work") else {}
            return [({label: name.removesuffix(suffix)}, float(done[name])) for name in names if name in done]

        return samples

    registry.callback("sovits_engine_work_total", "What the serving schedulers did: decode steps, tokens decoded "
                      "(rows x steps), prefills and the sentences in them, acoustic rounds, chunks voiced in them, "
                      "rounds queued behind an unfinished one, first chunks delivered.",
                      work(("decode_steps", "tokens", "prefills", "prefill_rows", "acoustic_rounds", "acoustic_chunks",
                            "acoustic_overlapped", "first_chunks"), "kind"), ("kind",), kind="counter")
    registry.callback("sovits_engine_busy_seconds_total", "Seconds the serving schedulers' threads spent in decode "
                      "steps, prefills and acoustic rounds (gate_wait: of the steps' and prefills', waiting for a "
                      "graph capture to end; prefill_setup: of the prefills', the rows' host set-up before the "
                      "device prefill); first_chunk_tokens / first_chunk_audio: the first chunks' waits summed "
                      "(request to its first token chunk, then to that chunk's audio).",
                      work(("decode_seconds", "prefill_seconds", "prefill_setup_seconds", "gate_wait_seconds", "acoustic_seconds",
                            "first_chunk_tokens_seconds", "first_chunk_audio_seconds"), "stage"), ("stage",),
                      kind="counter")
    registry.callback("sovits_engine_occupancy_seconds_total", "Time integrals of where requests were: before the "
                      "scheduler, splitting their text, getting their reference (from the cache or prepared), "
                      "reading their first sentence; in it, admitted with tokens to decode, sentences decoding in "
                      "rows, sentences waiting for a prefill, acoustic jobs queued. Their rate is the mean number "
                      "in each place.",
                      work(("split_occupancy_seconds", "reference_occupancy_seconds",
                            "first_sentence_occupancy_seconds", "admitted_occupancy_seconds",
                            "decoding_occupancy_seconds", "prefill_queue_occupancy_seconds",
                            "acoustic_queue_occupancy_seconds"), "place",
                           suffix="_occupancy_seconds"), ("place",), kind="counter")
    registry.callback("sovits_cpu_fallback_total", "Stage runs moved to the CPU because the accelerator lacks "
                      "one of their operators.", fallbacks, ("stage",), kind="counter")
    registry.callback("sovits_memory_degrade_total", "Memory watermark decisions: degrade steps run, requests "
                      "refused, moved to the CPU, waited, steps undone.", degrade, ("step",), kind="counter")
    registry.callback("sovits_memory_reading_bytes", "Memory readings of the watermark (used and total per "
                      "source: system, mps, cuda:N).", readings, ("source", "kind"))
