"""The server's memory, read from its Prometheus ``/metrics`` (only when it exports process memory), and what
its engine did meanwhile (``sovits_engine_*``, when exported): how the decode loop and the acoustic stage shared
the level's time."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from typing import Any

from studio.loadtest.client import IncompleteResponse, Request, Target, simple

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")  # name{labels} value [timestamp]
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
# /metrics series that carry the server process's resident memory: ours, then the Prometheus client's
RSS_SERIES = (("sovits_host_memory_bytes", {"kind": "rss"}), ("process_resident_memory_bytes", {}))
DEVICE_SERIES = ("sovits_device_memory_bytes", {"kind": "allocated"})
# the engine's counters: (series, its label, the prefix its values take in engine_work)
WORK_SERIES = (("sovits_engine_work_total", "kind", ""), ("sovits_engine_busy_seconds_total", "stage", ""),
               ("sovits_engine_occupancy_seconds_total", "place", "in_"))


def engine_work(metrics: dict[str, list[tuple[dict[str, str], float]]]) -> dict[str, float]:
    """The engine's counters of one scrape: {kind or stage: value} (empty when the server exports none)."""
    out = {prefix + labels[label]: value for name, label, prefix in WORK_SERIES
           for labels, value in metrics.get(name, []) if label in labels}
    captures = _series_sum(metrics, "sovits_acoustic_graph_captures_total", {"phase": "serving"})
    if out and captures is not None:
        out["acoustic_captures"] = captures
    for series, key in (("sovits_cache_hits_total", "reference_hits"), ("sovits_cache_misses_total", "reference_misses")):
        value = _series_sum(metrics, series, {"cache": "reference"})
        if out and value is not None:
            out[key] = value
    return out


def work_figures(first: tuple[float, dict[str, float]], last: tuple[float, dict[str, float]]) -> dict[str, Any]:
    """What the engine did between two scrapes ((time, engine_work)), per second and per step, round and first
    chunk: the decode loop's steps, rows and time share, the acoustic rounds' chunks and time share."""
    seconds = last[0] - first[0]
    d = {k: last[1][k] - first[1].get(k, 0.0) for k in last[1]}
    if seconds <= 0 or not d:
        return {}

    def per(a: str, b: str, scale: float = 1.0) -> float | None:
        return round(scale * d[a] / d[b], 3) if d.get(b) and a in d else None

    return {"seconds": round(seconds, 2),
            "decode_steps_per_s": round(d.get("decode_steps", 0) / seconds, 1),
            "rows_per_step": per("tokens", "decode_steps"), "ms_per_step": per("decode", "decode_steps", 1e3),
            "decode_busy": round(d.get("decode", 0) / seconds, 3),
            "prefill_busy": round(d.get("prefill", 0) / seconds, 3),
            "prefills_per_s": round(d.get("prefills", 0) / seconds, 1), "rows_per_prefill": per("prefill_rows", "prefills"),
            "ms_per_prefill": per("prefill", "prefills", 1e3),
            "ms_setup_per_prefill": per("prefill_setup", "prefills", 1e3),
            "gate_wait_busy": round(d.get("gate_wait", 0) / seconds, 3),
            "acoustic_captures": int(d.get("acoustic_captures", 0)),
            "acoustic_rounds_per_s": round(d.get("acoustic_rounds", 0) / seconds, 1),
            "chunks_per_round": per("acoustic_chunks", "acoustic_rounds"),
            "ms_per_round": per("acoustic", "acoustic_rounds", 1e3),
            "acoustic_busy": round(d.get("acoustic", 0) / seconds, 3),
            "rounds_overlapped": per("acoustic_overlapped", "acoustic_rounds"),
            "first_chunks": int(d.get("first_chunks", 0)),
            "first_chunk_tokens_s": per("first_chunk_tokens", "first_chunks"),
            "first_chunk_audio_s": per("first_chunk_audio", "first_chunks"),
            # prepared references found in the engine's cache (each client uploads its own clip)
            "reference_hit_ratio": (round(d["reference_hits"] / (d["reference_hits"] + d["reference_misses"]), 3)
                                    if d.get("reference_hits", 0) + d.get("reference_misses", 0) else None),
            # mean number in each place over the interval (requests splitting their text, getting their reference,
            # reading their first sentence; admitted with tokens to decode, sentences decoding, sentences waiting
            # for a prefill, acoustic jobs queued)
            **{f"mean_{place}": round(d[f"in_{place}"] / seconds, 1)
               for place in ("split", "reference", "first_sentence", "admitted", "decoding", "prefill_queue",
                             "acoustic_queue") if f"in_{place}" in d}}


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text exposition -> {name: [(labels, value)]} (comments and bad lines skipped)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m is None:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(m.group(2) or "")}
        out.setdefault(m.group(1), []).append((labels, value))
    return out


def _series_sum(metrics: dict[str, list[tuple[dict[str, str], float]]], name: str,
                match: dict[str, str]) -> float | None:
    values = [v for labels, v in metrics.get(name, []) if all(labels.get(k) == want for k, want in match.items())]
    return sum(values) if values else None


@dataclass
class MemoryProbe:
    """Samples the server's resident memory (and device memory, when exported) from ``/metrics``.
    ``available`` is decided by one first scrape; if it shows no process memory, nothing more is asked."""

    target: Target
    available: bool = False
    note: str = ""
    rss: list[float] = field(default_factory=list)
    device: list[float] = field(default_factory=list)
    work: list[tuple[float, dict[str, float]]] = field(default_factory=list)  # the level's first and last scrape

    async def probe(self) -> None:
        """The first scrape (connection errors propagate: the server is not there)."""
        status, body = await simple(self.target, Request("GET", "/metrics"), 10.0)
        if status != 200:
            self.note = f"n/a: the server has no /metrics (HTTP {status})"
            return
        if self._record(parse_metrics(body.decode("utf-8", "replace"))):
            self.available, self.note = True, "from /metrics"
        else:
            self.note = "n/a: the server's /metrics exports no process memory"

    def _record(self, metrics: dict[str, list[tuple[dict[str, str], float]]]) -> bool:
        rss = next((v for name, match in RSS_SERIES if (v := _series_sum(metrics, name, match)) is not None), None)
        if rss is None:
            return False
        self.rss.append(rss)
        work = engine_work(metrics)
        if work:
            snap = (time.perf_counter(), work)
            self.work = [self.work[0], snap] if self.work else [snap]
        device = _series_sum(metrics, *DEVICE_SERIES)
        if device is not None:
            self.device.append(device)
        return True

    async def sample(self) -> None:
        try:
            status, body = await simple(self.target, Request("GET", "/metrics"), 10.0)
        except (OSError, IncompleteResponse, asyncio.TimeoutError):
            return
        if status == 200:
            self._record(parse_metrics(body.decode("utf-8", "replace")))

    async def watch(self, interval_s: float) -> None:
        """Sample every ``interval_s`` seconds until cancelled."""
        while True:
            await self.sample()
            await asyncio.sleep(interval_s)

    def reset(self) -> None:
        self.rss, self.device, self.work = [], [], []

    def report(self) -> dict[str, Any] | str:
        if not self.available or not self.rss:
            return self.note or "n/a"
        mb = 1 << 20
        out: dict[str, Any] = {"rss_mb": {"start": round(self.rss[0] / mb, 1), "peak": round(max(self.rss) / mb, 1),
                                          "end": round(self.rss[-1] / mb, 1)}}
        if self.device:
            out["device_allocated_mb"] = {"start": round(self.device[0] / mb, 1),
                                          "peak": round(max(self.device) / mb, 1),
                                          "end": round(self.device[-1] / mb, 1)}
        if len(self.work) == 2:
            out["engine"] = work_figures(*self.work)
        return out
