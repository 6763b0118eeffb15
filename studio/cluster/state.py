"""What the cluster shares besides the voice folder: its default model set (``/set_*_weights``) and the
latest report of every replica (for ``/health`` and ``/metrics``). One small Serve deployment holds it.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass

from studio.cluster.routing import Defaults, ModelSet


@dataclass(frozen=True)
class ReplicaReport:
    """What a replica tells the cluster every ``report_interval_s``."""

    replica: str  # Serve's replica id
    pid: int
    node: str  # Ray node id
    host: str
    device: str
    model_sets: tuple[str, ...]  # ids of the model sets it holds (its multiplexed models), oldest first
    running: int  # syntheses being computed
    queued: int  # admitted, waiting for a worker
    metrics: str  # its /metrics text

    def to_json(self, age_s: float) -> dict:
        return {"replica": self.replica, "pid": self.pid, "node": self.node, "host": self.host,
                "device": self.device, "model_sets": [ModelSet.from_id(m).to_json() for m in self.model_sets],
                "running": self.running, "queued": self.queued, "last_report_s": round(age_s, 1)}


class ClusterState:
    """The default model set, versioned, and the replicas' reports (async methods: Serve runs them on the
    replica's event loop, one at a time). A replica whose last report is older
    than ``stale_after_s`` (by this process's clock) counts as gone: a dead one stops reporting."""

    def __init__(self, defaults: ModelSet, stale_after_s: float = 5.0) -> None:
        self._defaults = Defaults(defaults, epoch=uuid.uuid4().hex[:12])
        self._reports: dict[str, tuple[ReplicaReport, float]] = {}
        self._lock = threading.Lock()
        self.stale_after_s = stale_after_s

    async def defaults(self) -> Defaults:
        return self._defaults

    async def set_defaults(self, models: ModelSet) -> Defaults:
        with self._lock:
            d = self._defaults
            self._defaults = Defaults(models, d.epoch, d.generation + 1)
            return self._defaults

    async def report(self, report: ReplicaReport) -> None:
        with self._lock:
            self._reports[report.replica] = (report, time.monotonic())

    async def replicas(self) -> list[tuple[ReplicaReport, float]]:
        """The live replicas' latest reports with their age in seconds, by replica id."""
        now = time.monotonic()
        with self._lock:
            for key in [k for k, (_, t) in self._reports.items() if now - t > self.stale_after_s]:
                del self._reports[key]
            return sorted(((r, now - t) for r, t in self._reports.values()), key=lambda x: x[0].replica)
